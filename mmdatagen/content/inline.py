"""The bounded cache of inline payloads (base64 data URLs, ``fmt,base64`` audio) of one run.

Inline rows hold their items, so a run renders each item when a batch of rows first needs it and
keeps it while later rows still do. Beyond the byte budget the items used furthest in the
future go first (Belady's rule, exact here: every future use is known from the plan). Eviction
only decides what is rendered again; a render is a pure function of (style, seed, id), so the
output bytes never depend on it.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


def use_positions(keys_per_row: Iterable[Iterable[K]]) -> dict[K, deque[int]]:
    """For each key, the positions (row order) of the rows that use it."""
    uses: dict[K, deque[int]] = {}
    for pos, keys in enumerate(keys_per_row):
        for key in keys:
            uses.setdefault(key, deque()).append(pos)
    return uses


class InlineCache(Generic[K]):
    """Inline payloads by key, at most ``budget`` characters after each :meth:`evict`."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.payloads: dict[K, str] = {}
        self.size = 0

    def __contains__(self, key: K) -> bool:
        return key in self.payloads

    def __getitem__(self, key: K) -> str:
        return self.payloads[key]

    def add(self, key: K, payload: str) -> None:
        old = self.payloads.get(key)
        if old is not None:
            self.size -= len(old)
        self.payloads[key] = payload
        self.size += len(payload)

    def evict(self, uses: dict[K, deque[int]], position: int) -> None:
        """Drop payloads no row from ``position`` on uses, then the furthest-next-use ones
        while over the budget (``uses`` is consumed up to ``position``)."""
        done = [k for k, q in uses.items() if k in self.payloads and (not q or q[0] < position)]
        for key in done:
            queue = uses[key]
            while queue and queue[0] < position:
                queue.popleft()
            if not queue:
                self._drop(key)
        if self.size <= self.budget:
            return
        for key in sorted(self.payloads, key=lambda k: uses[k][0] if uses[k] else -1,
                          reverse=True):
            self._drop(key)
            if self.size <= self.budget:
                break

    def _drop(self, key: K) -> None:
        self.size -= len(self.payloads.pop(key))
