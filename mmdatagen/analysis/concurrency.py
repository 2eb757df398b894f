"""Dispatch order and in-flight effects: when requests run concurrently, which lookups can hit.

Completion model (simple on purpose, documented in ``mmdatagen analyze --help``): at most K
requests are in flight and they complete first-in first-out; when one completes, the next request
is dispatched at once (no think time, ``delay`` ignored).

- ``file`` order: requests are dispatched in file order, K in flight.
- ``sessions`` (AIPerf's causal replay of ``session_id`` rows): sessions start in order of first
  appearance, at most K at a time; a session's next row is dispatched only when its previous row
  completes; a finished session frees its slot for the next session.

A cache that registers entries when a request is scheduled sees only the dispatch order (then the
one-pass curve over that order is exact). A cache that inserts at completion is replayed event by
event (``completion_hits``), one capacity per pass.
"""
from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from ..errors import UserError

DISPATCH = ("file", "sessions")


def events(num_rows: int, in_flight: int, sessions: np.ndarray | None = None,
           dispatch: str = "file") -> np.ndarray:
    """Dispatch and completion events in time order: row r dispatched is ``r``, completed ``~r``."""
    if in_flight < 1:
        raise UserError(f"--in-flight must be at least 1, got {in_flight}")
    if dispatch not in DISPATCH:
        raise UserError(f"unknown dispatch order {dispatch!r}; choose from {', '.join(DISPATCH)}")
    out: list[int] = []
    if dispatch == "file" or sessions is None:
        for r in range(num_rows):
            if r >= in_flight:
                out.append(~(r - in_flight))
            out.append(r)
        out.extend(~r for r in range(max(0, num_rows - in_flight), num_rows))
        return np.array(out, np.int64)
    groups = session_rows(sessions)
    waiting = deque(range(len(groups)))
    pos = [0] * len(groups)
    running: deque[tuple[int, int]] = deque()  # (row, session) in dispatch order

    def start(g: int) -> None:
        row = int(groups[g][pos[g]])
        pos[g] += 1
        running.append((row, g))
        out.append(row)

    while waiting and len(running) < in_flight:
        start(waiting.popleft())
    while running:
        row, g = running.popleft()
        out.append(~row)
        if pos[g] < len(groups[g]):
            start(g)
        elif waiting:
            start(waiting.popleft())
    return np.array(out, np.int64)


def session_rows(sessions: np.ndarray) -> list[np.ndarray]:
    """Row indices per session, sessions by first appearance, rows in file order."""
    sessions = np.asarray(sessions)
    _, first, inverse = np.unique(sessions, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rows = np.argsort(inverse.reshape(-1), kind="stable")
    bounds = np.cumsum(np.bincount(inverse.reshape(-1), minlength=first.size))
    split = np.split(rows, bounds[:-1])
    return [split[i] for i in order]


def dispatch_order(ev: np.ndarray) -> np.ndarray:
    """Rows in the order they are dispatched."""
    return ev[ev >= 0]


def completion_hits(ev: np.ndarray, row_refs: list[np.ndarray], obj_sizes: np.ndarray,
                    capacity: float, oversize: str = "bypass") -> list[np.ndarray]:
    """Per row, hit flags of its references when entries are inserted only at completion.

    A lookup at dispatch hits if the entry is present (and refreshes it); a missed entry is stored
    when its request completes (unless another request stored it meanwhile: then refreshed).
    """
    sizes = obj_sizes.tolist()
    cache: OrderedDict[int, int] = OrderedDict()
    used = 0
    pending: dict[int, list[int]] = {}
    hits: list[np.ndarray] = [np.zeros(0, bool)] * len(row_refs)
    for e in ev.tolist():
        if e >= 0:
            refs = row_refs[e].tolist()
            flags = []
            for x in refs:
                if x in cache:
                    cache.move_to_end(x)
                    flags.append(True)
                else:
                    flags.append(False)
            hits[e] = np.array(flags, bool)
            pending[e] = [x for x, f in zip(refs, flags) if not f]
            continue
        for x in pending.pop(~e):
            if x in cache:
                cache.move_to_end(x)
                continue
            s = sizes[x]
            if s > capacity:
                if oversize == "flush":
                    cache.clear()
                    used = 0
                continue
            cache[x] = s
            used += s
            while used > capacity:
                used -= cache.popitem(last=False)[1]
    return hits
