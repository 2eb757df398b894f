"""Hit curves for every cache target (``mmdatagen.caches``), all capacities at once where the
policy allows it.

- LRU looked up and filled at schedule (Dynamo aggregated, vLLM encoder at one request in
  flight): the one-pass stack curve (``lru.lru_curve``).
- vLLM's processor cache touches a request's cached items before inserting its misses, so an
  item hits iff it was resident when the request started: the stack distance is taken at the
  request's start (``kernels.touch_kernel``). Exact for every capacity that holds each request's
  distinct items together; below that, an exact replay at the asked capacities.
- SGLang keys one entry by the request's whole image set: a stack curve over sets, each set's
  answer counted for all its images.
- A FIFO (vLLM's shm ring) has no inclusion property: one compiled replay per capacity.
- Insert at encoder completion (Dynamo disaggregated) depends on completion order: event
  replays per capacity (``concurrency``), the spread over orders in ``predict``; one request
  at a time, per-reference bounds from one recency pass (``sampled.OneAtATime``).

``Replay`` is the exact reference for any target at one capacity: it drives the shared cache
model (``caches.model``), the implementation the simulator runs.
"""
from __future__ import annotations

import numpy as np

from ..caches import CacheTarget, make_cache
from . import kernels as K
from .lru import Curve, _step_curve, required_capacity
from .trace import Trace


def row_starts(trace: Trace) -> np.ndarray:
    return trace.row_start


def touch_required(trace: Trace, sizes: np.ndarray, req: np.ndarray | None = None
                   ) -> np.ndarray:
    """Per reference, the smallest capacity at which it hits in a touch-first LRU; exact for
    capacities of at least :func:`request_span` (below, use :class:`Replay`). ``req``: the
    plain stack distances (``lru.required_capacity``) when already computed (rewritten)."""
    ids = np.ascontiguousarray(trace.ids, np.int64)
    sizes = np.asarray(sizes, np.int64)
    if req is None:
        req = required_capacity(ids, sizes[ids], sizes.size)
    if ids.size == 0:
        return req
    fn = K.for_size(K.touch_kernel, ids.size)
    if fn is K.touch_kernel:  # plain Python: lists are faster than numpy scalars
        out = fn(ids.tolist(), row_starts(trace).tolist(), req.tolist(), sizes.tolist(),
                 [-1] * sizes.size, [-1] * ids.size)
        return np.asarray(out, np.int64)
    return fn(ids, row_starts(trace), req, sizes, np.full(sizes.size, -1, np.int64),
              np.full(ids.size, -1, np.int64))


def request_span(trace: Trace, sizes: np.ndarray) -> int:
    """The largest total size of one request's distinct objects."""
    if trace.ids.size == 0:
        return 0
    fn = K.for_size(K.span_kernel, trace.ids.size)
    return int(fn(np.ascontiguousarray(trace.ids, np.int64), trace.row_start,
                  np.asarray(sizes, np.int64), np.full(sizes.size, -1, np.int64)))


def fifo_flags(trace: Trace, sizes: np.ndarray, capacity: float) -> np.ndarray:
    ids = np.ascontiguousarray(trace.ids, np.int64)
    m = sizes.size
    fn = K.for_size(K.fifo_kernel, ids.size)
    flags = fn(ids, np.asarray(sizes, np.int64), int(min(capacity, 1 << 62)),
               np.zeros(ids.size, np.int64), np.zeros(m, np.int64), np.zeros(m + 1, np.int64))
    return np.asarray(flags, bool)


def set_trace(trace: Trace, sizes: np.ndarray, tokens: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One object per request's image set: (set id per request with images, the rows they
    belong to, set sizes, set tokens)."""
    lens = np.bincount(trace.ref_row, minlength=trace.num_rows)
    rows = np.flatnonzero(lens)
    if rows.size == 0:
        return (np.zeros(0, np.int64),) * 4
    width = int(lens.max())
    if width == 1:
        keys = trace.ids.reshape(-1, 1)
    else:
        keys = np.full((trace.num_rows, width), -1, np.int64)
        starts = row_starts(trace)
        pos = np.arange(trace.ids.size) - starts[trace.ref_row]
        keys[trace.ref_row, pos] = trace.ids
        keys = keys[rows]
    m = int(trace.ids.max()) + 2
    if width * np.log2(m) < 62:  # one int64 per set: a 1-D unique (fast)
        packed = np.zeros(keys.shape[0], np.int64)
        for k in range(width):
            packed = packed * m + (keys[:, k] + 1)
        set_ids, first = first_ids(packed)
    else:
        _, first, set_ids = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    set_ids = set_ids.reshape(-1).astype(np.int64)
    row_bytes = np.bincount(trace.ref_row, weights=sizes[trace.ids], minlength=trace.num_rows)
    row_tokens = np.bincount(trace.ref_row, weights=tokens[trace.ids], minlength=trace.num_rows)
    set_sizes = row_bytes[rows][first].astype(np.int64)
    set_tokens = row_tokens[rows][first].astype(np.int64)
    return set_ids, rows, set_sizes, set_tokens


def first_ids(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense ids of int64 ``keys`` in order of first appearance, and each id's first index
    (``kernels.first_kernel``: a hash table, where ``np.unique`` would sort)."""
    n = int(keys.size)
    table = np.full(1 << max(int(2 * n).bit_length(), 1), -1, np.int64)
    ids, first = np.empty(n, np.int64), np.empty(n, np.int64)
    fn = K.for_size(K.first_kernel, n)
    if fn is K.first_kernel:
        lists = [a.tolist() for a in (keys, table, ids, first)]
        count = fn(*lists)
        return np.asarray(lists[2], np.int64), np.asarray(lists[3][:count], np.int64)
    return ids, first[:fn(keys, table, ids, first)]


def set_curve(trace: Trace, sizes: np.ndarray, tokens: np.ndarray) -> Curve:
    """SGLang: a stack curve over image sets (flush on oversize: exact at every capacity); a
    set's answer counts for each of its images."""
    set_ids, rows, set_sizes, _ = set_trace(trace, sizes, tokens)
    req_sets = required_capacity(set_ids, set_sizes[set_ids], set_sizes.size)
    req_rows = np.full(trace.num_rows, -1, np.int64)
    req_rows[rows] = req_sets
    return Curve.of(_step_curve(req_rows[trace.ref_row], trace.ids, sizes, tokens, trace.ref_row,
                                obj_mod=trace.modality))


class Replay:
    """Exact hits of ``target`` at one capacity over ``events`` (row r looked up is ``r``, its
    later moment ``~r``; default: every row in order, each finishing before the next), through
    the shared cache model. A two-tier target also needs its front: ``front_tokens`` (budget)
    and ``bytes_per_token``; its flags are the connector's hits."""

    def __init__(self, target: CacheTarget, trace: Trace, sizes: np.ndarray,
                 events: np.ndarray | None = None, front_tokens: int | None = None,
                 bytes_per_token: int | None = None) -> None:
        from ..caches.entries import request_items

        self.target, self.trace = target, trace
        self.front = {"front_tokens": front_tokens, "bytes_per_token": bytes_per_token}
        self.counters: dict[str, int] = {}
        starts = row_starts(trace)
        ids = trace.ids.tolist()
        sz = sizes.tolist()
        self.items = []
        for r in range(trace.num_rows):
            refs = ids[starts[r]:starts[r + 1]]
            self.items.append(request_items(target, refs, [sz[x] for x in refs]))
        self.lens = np.diff(starts)
        if events is None:
            events = np.empty(2 * trace.num_rows, np.int64)
            events[0::2] = np.arange(trace.num_rows)
            events[1::2] = ~np.arange(trace.num_rows)
        self.events = events

    def flags(self, capacity: int) -> np.ndarray:
        """Hit flag per reference (file order of the trace); the cache's counters after the
        replay in ``counters``."""
        from ..caches.entries import image_flags

        cache = make_cache(self.target, capacity, front_tokens=self.front["front_tokens"],
                           bytes_per_token=self.front["bytes_per_token"])
        per_row: list = [None] * self.trace.num_rows
        for e in self.events.tolist():
            if e < 0:
                cache.finish(~e)
            else:
                per_row[e] = image_flags(self.target, cache.lookup(e, self.items[e]),
                                         int(self.lens[e]))
        self.counters = cache.counters()
        return np.fromiter((f for row in per_row for f in (row or ())), bool,
                           self.trace.ids.size)
