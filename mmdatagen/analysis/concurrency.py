"""Dispatch order and in-flight effects: when requests run concurrently, which lookups can hit.

Completion model (simple on purpose, documented in ``mmdatagen analyze --help``): at most K
requests are in flight and they complete first-in first-out; when one completes, the next request
is dispatched at once (no think time, ``delay`` ignored).

- ``sessions`` (AIPerf's causal replay of ``session_id`` rows): the dispatch core of the loader
  and ``simulate`` (``mmdatagen.scheduling``) with K slots, driven by completion order alone:
  sessions start in order of first appearance, at most K at a time; a session's next row is
  dispatched only when its previous row completes; a finished session frees its slot for the next
  session.
- ``file`` order: every row a session of its own, so requests are dispatched in file order, K in
  flight. The core's order then has a closed form (first-in first-out) and a compiled loop (a
  seeded random completion), both checked against the core in ``tests/test_scheduling.py``.

A cache that registers entries when a request is scheduled sees only the dispatch order (then the
one-pass curve over that order is exact). A cache that inserts at completion is replayed event by
event (``completion_flags``, ``kernels.completion_kernel``), one capacity per pass.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from ..errors import SpecError, UserError
from ..scheduling import PROFILING, SEND, Core, Phase, Slot
from ..sessions import Replay, Replayed, group_ids
from . import kernels as K

DISPATCH = ("file", "sessions")


def events(num_rows: int, in_flight: int, sessions: np.ndarray | None = None,
           dispatch: str = "file", seed: int | None = None) -> np.ndarray:
    """Dispatch and completion events in time order: row r dispatched is ``r``, completed ``~r``.

    ``seed`` None: the oldest request in flight completes first; else a seeded random one."""
    if in_flight < 1:
        raise SpecError("in_flight", f"must be at least 1, got {in_flight}")
    if dispatch not in DISPATCH:
        raise UserError(f"unknown dispatch order {dispatch!r}; choose from {', '.join(DISPATCH)}")
    rng = None if seed is None else np.random.default_rng(seed)
    if rng is not None and (dispatch == "file" or sessions is None):
        return _random_file_events(num_rows, in_flight, rng)
    if dispatch == "file" or sessions is None:
        n, k = num_rows, min(in_flight, num_rows)
        mid = np.empty(2 * (n - k), np.int64)
        mid[0::2] = ~np.arange(n - k)      # the oldest in flight completes ...
        mid[1::2] = np.arange(k, n)        # ... and the next row is dispatched
        return np.concatenate([np.arange(k), mid, ~np.arange(n - k, n)]).astype(np.int64)
    return _session_events(session_rows(sessions), in_flight, rng)


def _session_events(groups: list[np.ndarray], in_flight: int, rng) -> np.ndarray:
    """The dispatch core (``mmdatagen.scheduling``: ``in_flight`` slots, each replaying one
    session at a time, sessions in start order) driven by completion order alone: the oldest
    request in flight completes next (``rng`` None), else a seeded random one."""
    core: Core[Replayed[int], int] = Core(Replay([g.tolist() for g in groups], wrap=False),
                                          [Phase(PROFILING)])
    out: list[int] = []
    running: deque[tuple[int, Slot[Replayed[int], int]]] = deque()  # in dispatch order
    ask, complete, emit, queue = core.next, core.complete, out.append, running.append
    for _ in range(in_flight):  # then each completion lets its slot ask again
        slot = core.add_slot()
        if ask(slot, 0.0) == SEND:
            row: int = slot.turn  # type: ignore[assignment]  # a sent turn is a row
            queue((row, slot))
            emit(row)
    while running:
        if rng is None:
            row, slot = running.popleft()
        else:
            k = int(rng.integers(len(running)))
            row, slot = running[k]
            del running[k]
        emit(~row)
        complete(slot, 0.0)
        if ask(slot, 0.0) == SEND:
            row = slot.turn  # type: ignore[assignment]
            queue((row, slot))
            emit(row)
    return np.array(out, np.int64)


def _random_file_events(num_rows: int, in_flight: int, rng) -> np.ndarray:
    draws = rng.integers(0, 1 << 62, size=max(num_rows, 1))
    out = np.empty(2 * num_rows, np.int64)
    return K.for_size(K.random_events_kernel, num_rows)(num_rows, in_flight, draws, out)


def session_rows(sessions: np.ndarray) -> list[np.ndarray]:
    """Row indices per session, sessions by first appearance, rows in file order (the rule of
    ``mmdatagen.sessions``, which the loader and ``simulate`` follow too)."""
    return group_ids(sessions)


def dispatch_order(ev: np.ndarray) -> np.ndarray:
    """Rows in the order they are dispatched."""
    return ev[ev >= 0]


def completion_flags(ev: np.ndarray, row_start: np.ndarray, ids: np.ndarray, obj_sizes: np.ndarray,
                     capacity: float, oversize: str = "bypass",
                     compiled: bool | None = None) -> np.ndarray:
    """Hit flag per reference under insert-at-completion (numba for long traces by default)."""
    m = obj_sizes.size
    args = (ev, row_start, ids, np.asarray(obj_sizes, np.int64), int(min(capacity, 1 << 62)),
            oversize == "flush", np.zeros(ids.size, np.int64), np.full(m, -1, np.int64),
            np.full(m, -1, np.int64), np.zeros(m, np.int64))
    if compiled is None:
        compiled = ids.size > K.PYTHON_MAX_REFS
    if compiled:
        return K.compiled(K.completion_kernel)(*args).astype(bool)
    return np.array(K.completion_kernel(*(a.tolist() if isinstance(a, np.ndarray) else a
                                          for a in args)), bool)
