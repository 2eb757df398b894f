"""Exact byte-LRU hit counts for every capacity at once (see ``kernels.py`` for the one pass).

Semantics: an LRU by bytes that evicts whole objects from the LRU end. An object larger than the
capacity is either bypassed (Dynamo: not inserted, nothing evicted) or flushes the cache and then
fails to insert (SGLang). With "flush" the one-pass answer is exact at every capacity; with
"bypass" the capacities below the largest object are recomputed per size tier on the trace
without the objects that do not fit (exact, but one more pass per distinct size below the max).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from .kernels import stack_kernel

OVERSIZE = ("bypass", "flush")
# Below this many references the plain-Python kernel beats importing numba and loading its cache.
PYTHON_MAX_REFS = 30_000
_COMPILED = None


def _kernel():
    global _COMPILED
    if _COMPILED is None:
        from .kernels import _compiled

        _COMPILED = _compiled() or stack_kernel
    return _COMPILED


def dense_ids(keys: Sequence | np.ndarray) -> tuple[np.ndarray, int]:
    """Map keys (hashables or integers) to ids 0..M-1; returns ``(ids, M)``."""
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":
        keys = keys.astype(np.int64, copy=False).reshape(-1)
        if keys.size == 0:
            return keys, 0
        lo, hi = int(keys.min()), int(keys.max())
        if lo >= 0 and hi < 2 * keys.size + 1024:
            return keys, hi + 1  # already small non-negative ids: unused ids cost nothing
        uniq, inv = np.unique(keys, return_inverse=True)
        return inv.astype(np.int64).reshape(-1), int(uniq.size)
    table: dict = {}
    ids = np.fromiter((table.setdefault(k, len(table)) for k in keys), np.int64)
    return ids, len(table)


def object_sizes(ids: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per reference, the size its key had at its first reference (an entry keeps its size)."""
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    return np.asarray(sizes, np.int64)[first][inv.reshape(-1)]


def required_capacity(ids: np.ndarray, sizes: np.ndarray, num_objects: int | None = None,
                      compiled: bool | None = None) -> np.ndarray:
    """Smallest byte capacity at which each reference hits (-1: first reference, never hits).

    ``ids`` are dense object ids, ``sizes`` per-reference sizes (a key's first size counts).
    ``compiled`` forces the numba (True) or Python (False) kernel; default by trace length.
    """
    ids = np.ascontiguousarray(ids, np.int64)
    sizes = np.ascontiguousarray(sizes, np.int64)
    n = ids.size
    m = int(ids.max()) + 1 if num_objects is None and n else (num_objects or 0)
    slots = 2 * m + 2
    if compiled is None:
        compiled = n > PYTHON_MAX_REFS
    if not compiled:
        req = [0] * n
        stack_kernel(ids.tolist(), sizes.tolist(), req, [-1] * m, [0] * m, [0] * (slots + 1),
                     [-1] * (slots + 1))
        return np.array(req, np.int64)
    req = np.empty(n, np.int64)
    _kernel()(ids, sizes, req, np.full(m, -1, np.int64), np.zeros(m, np.int64),
              np.zeros(slots + 1, np.int64), np.full(slots + 1, -1, np.int64))
    return req


@dataclass
class Curve:
    """Hits as a step function of capacity: from ``capacity[k]`` up to ``capacity[k+1]``
    (exclusive) the cache gets ``hits[k]`` reference hits, ``hit_bytes[k]`` bytes, ``hit_tokens[k]``
    tokens and ``full_requests[k]`` requests whose images all hit. Below ``capacity[0]``: nothing.
    """

    capacity: np.ndarray
    hits: np.ndarray
    hit_bytes: np.ndarray
    hit_tokens: np.ndarray
    full_requests: np.ndarray

    def at(self, capacities: Sequence[float] | np.ndarray) -> dict[str, np.ndarray]:
        """The four counts at each given capacity."""
        caps = np.asarray(capacities, dtype=np.float64)
        k = np.searchsorted(self.capacity, caps, side="right") - 1
        out = {}
        for name in ("hits", "hit_bytes", "hit_tokens", "full_requests"):
            col = getattr(self, name)
            vals = np.where(k >= 0, col[np.maximum(k, 0)] if col.size else 0, 0)
            out[name] = vals.astype(np.int64)
        return out

    def smallest_capacity(self, min_hits: float) -> int | None:
        """The smallest capacity with at least ``min_hits`` hits (None: never reached)."""
        idx = np.flatnonzero(self.hits >= min_hits)
        return int(self.capacity[idx[0]]) if idx.size else None


def _step_curve(req: np.ndarray, sizes: np.ndarray, tokens: np.ndarray, req_of_row: np.ndarray,
                lo: int = 0, hi: float = np.inf) -> tuple[np.ndarray, ...]:
    """Breakpoints of a stack curve (hit iff req <= C), restricted to capacities in [lo, hi)."""
    hit = req >= 0
    order = np.argsort(req[hit], kind="stable")
    r = req[hit][order]
    cum = [np.cumsum(v[hit][order]) for v in (np.ones_like(sizes), sizes, tokens)]
    rows = np.sort(req_of_row[req_of_row >= 0])
    caps = np.unique(np.concatenate([r, rows, [lo]]))
    caps = caps[(caps >= lo) & (caps < hi)]
    k = np.searchsorted(r, caps, side="right")
    cols = [np.where(k > 0, c[np.maximum(k - 1, 0)], 0) if c.size else np.zeros(caps.size, np.int64)
            for c in cum]
    full = np.searchsorted(rows, caps, side="right").astype(np.int64)
    return (caps, *cols, full)


def _row_max(req: np.ndarray, ref_row: np.ndarray, num_rows: int) -> np.ndarray:
    """Per row: the capacity at which all its references hit (-1: some never hit or no images)."""
    inf = np.iinfo(np.int64).max
    r = np.where(req < 0, inf, req)
    out = np.full(num_rows, -1, np.int64)
    if r.size:
        np.maximum.at(out, ref_row, r)
    out[out == inf] = -1
    return out


def lru_curve(ids: np.ndarray, sizes: np.ndarray, tokens: np.ndarray | None = None,
              ref_row: np.ndarray | None = None, num_rows: int | None = None,
              oversize: str = "bypass", num_objects: int | None = None) -> Curve:
    """The exact hit curve of a byte LRU over a trace, for every capacity.

    ``ids``/``sizes``/``tokens`` are per reference; ``ref_row`` maps references to requests
    (default: one request per reference) for the "all images hit" count.
    """
    if oversize not in OVERSIZE:
        raise UserError(f"unknown oversize policy {oversize!r}; choose from {', '.join(OVERSIZE)}")
    ids = np.asarray(ids, np.int64)
    sizes = np.asarray(sizes, np.int64)
    tokens = np.zeros_like(sizes) if tokens is None else np.asarray(tokens, np.int64)
    if ref_row is None:
        ref_row, num_rows = np.arange(ids.size), ids.size
    num_rows = int(ref_row.max()) + 1 if num_rows is None and ref_row.size else (num_rows or 0)
    if ids.size and sizes.min() <= 0:
        raise UserError("cache entry sizes must be positive")
    if oversize == "bypass" and ids.size:
        sizes = object_sizes(ids, sizes)
    req = required_capacity(ids, sizes, num_objects)
    parts = []
    if oversize == "bypass" and ids.size:
        tiers = np.unique(sizes)
        for lo, hi in zip(tiers[:-1], tiers[1:]):
            keep = sizes <= lo  # objects of larger size are bypassed at capacities in [lo, hi)
            sub = np.full(ids.size, -1, np.int64)
            sub[keep] = required_capacity(ids[keep], sizes[keep], num_objects)
            parts.append(_step_curve(sub, sizes, tokens, _row_max(sub, ref_row, num_rows),
                                     int(lo), int(hi)))
        lo = int(tiers[-1])
    else:
        lo = 0
    parts.append(_step_curve(req, sizes, tokens, _row_max(req, ref_row, num_rows), lo))
    cols = [np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(5)]
    return Curve(*cols)


def lru_hits(keys: Sequence | np.ndarray, sizes: Sequence[int] | np.ndarray, capacity_bytes: float,
             oversize: str = "bypass") -> np.ndarray:
    """Per reference: does it hit in a byte LRU of ``capacity_bytes``? (bool array)

    ``keys``: one hashable (or int) per reference in dispatch order; ``sizes``: bytes per
    reference (a key's first size counts). ``oversize``: "bypass" or "flush" for entries larger
    than the capacity.
    """
    if oversize not in OVERSIZE:
        raise UserError(f"unknown oversize policy {oversize!r}; choose from {', '.join(OVERSIZE)}")
    ids, m = dense_ids(keys)
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    if sizes.size != ids.size:
        raise UserError(f"got {sizes.size} sizes for {ids.size} keys")
    if ids.size == 0:
        return np.zeros(0, bool)
    obj = object_sizes(ids, sizes)
    if oversize == "bypass":
        keep = obj <= capacity_bytes
        out = np.zeros(ids.size, bool)
        req = required_capacity(ids[keep], obj[keep], m)
        out[keep] = (req >= 0) & (req <= capacity_bytes)
        return out
    req = required_capacity(ids, obj, m)
    return (req >= 0) & (req <= capacity_bytes)
