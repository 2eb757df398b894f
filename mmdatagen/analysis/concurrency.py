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
event (``completion_flags``, a compiled kernel), one capacity per pass.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import UserError

DISPATCH = ("file", "sessions")


def events(num_rows: int, in_flight: int, sessions: np.ndarray | None = None,
           dispatch: str = "file", seed: int | None = None) -> np.ndarray:
    """Dispatch and completion events in time order: row r dispatched is ``r``, completed ``~r``.

    ``seed`` None: the oldest request in flight completes first; else a seeded random one."""
    if in_flight < 1:
        raise UserError(f"--in-flight must be at least 1, got {in_flight}")
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
    out: list[int] = []
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
        if rng is None:
            row, g = running.popleft()
        else:
            k = int(rng.integers(len(running)))
            row, g = running[k]
            del running[k]
        out.append(~row)
        if pos[g] < len(groups[g]):
            start(g)
        elif waiting:
            start(waiting.popleft())
    return np.array(out, np.int64)


def random_events_kernel(n, k, draws, out):
    """File dispatch, ``k`` in flight, the next completion drawn among those in flight."""
    running = np.empty(max(k, 1), np.int64)
    cnt = nxt = pos = d = 0
    while nxt < n or cnt:
        while nxt < n and cnt < k:
            running[cnt] = nxt
            cnt += 1
            out[pos] = nxt
            pos += 1
            nxt += 1
        j = draws[d] % cnt
        d += 1
        out[pos] = ~running[j]
        pos += 1
        running[j] = running[cnt - 1]
        cnt -= 1
    return out


_JIT: dict[str, Callable[..., Any]] = {}


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by numba (cached on disk), or ``fn`` itself without numba."""
    if fn.__name__ not in _JIT:
        try:
            import numba

            _JIT[fn.__name__] = numba.njit(cache=True, nogil=True)(fn)
        except ImportError:  # pragma: no cover
            _JIT[fn.__name__] = fn
    return _JIT[fn.__name__]


def _random_file_events(num_rows: int, in_flight: int, rng) -> np.ndarray:
    draws = rng.integers(0, 1 << 62, size=max(num_rows, 1))
    out = np.empty(2 * num_rows, np.int64)
    fn = _compiled(random_events_kernel) if num_rows > 30_000 else random_events_kernel
    return fn(num_rows, in_flight, draws, out)


def session_rows(sessions: np.ndarray) -> list[np.ndarray]:
    """Row indices per session, sessions by first appearance, rows in file order (the rule of
    ``mmdatagen.sessions``, which the loader and ``simulate`` follow too)."""
    from ..sessions import group_ids

    return group_ids(sessions)


def dispatch_order(ev: np.ndarray) -> np.ndarray:
    """Rows in the order they are dispatched."""
    return ev[ev >= 0]


def completion_kernel(ev, row_start, ids, sizes, capacity, flush, hits, prev, nxt, present):
    """Hit flags under insert-at-completion (dense ids, doubly linked LRU list); fills ``hits``
    (zeros on entry). A lookup at dispatch (event ``r``) hits if the entry is present and
    refreshes it; at completion (``~r``) each missed entry is stored, or refreshed when another
    request stored it meanwhile. ``prev``/``nxt`` (-1) and ``present`` (0) have one slot per
    object; ``tail`` is the least recently used, ``head`` the most.
    """
    head = tail = -1
    used = 0
    for e in ev:
        done = e < 0
        r = ~e if done else e
        for i in range(row_start[r], row_start[r + 1]):
            x = ids[i]
            if done and hits[i]:
                continue
            if present[x]:
                if not done:
                    hits[i] = 1
                if x != head:  # unlink, then push to the front
                    nxt[prev[x]] = nxt[x]
                    if nxt[x] >= 0:
                        prev[nxt[x]] = prev[x]
                    else:
                        tail = prev[x]
                    prev[x] = -1
                    nxt[x] = head
                    prev[head] = x
                    head = x
                continue
            if not done:
                continue
            s = sizes[x]
            if s > capacity:
                while flush and head >= 0:  # flush: empty the cache, store nothing
                    y = head
                    head = nxt[y]
                    present[y] = 0
                    prev[y] = nxt[y] = -1
                    tail = -1
                    used = 0
                continue
            present[x] = 1
            prev[x] = -1
            nxt[x] = head
            if head >= 0:
                prev[head] = x
            else:
                tail = x
            head = x
            used += s
            while used > capacity:  # never empties: x alone fits
                y = tail
                tail = prev[y]
                nxt[tail] = -1
                present[y] = 0
                prev[y] = -1
                used -= sizes[y]
    return hits


def completion_flags(ev: np.ndarray, row_start: np.ndarray, ids: np.ndarray, obj_sizes: np.ndarray,
                     capacity: float, oversize: str = "bypass",
                     compiled: bool | None = None) -> np.ndarray:
    """Hit flag per reference under insert-at-completion (numba for long traces by default)."""
    m = obj_sizes.size
    args = (ev, row_start, ids, np.asarray(obj_sizes, np.int64), int(min(capacity, 1 << 62)),
            oversize == "flush", np.zeros(ids.size, np.int64), np.full(m, -1, np.int64),
            np.full(m, -1, np.int64), np.zeros(m, np.int64))
    if compiled is None:
        compiled = ids.size > 30_000
    if compiled:
        return _compiled(completion_kernel)(*args).astype(bool)
    return np.array(completion_kernel(*(a.tolist() if isinstance(a, np.ndarray) else a
                                        for a in args)), bool)
