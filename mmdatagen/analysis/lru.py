"""Exact byte-LRU hit counts for every capacity at once (the one pass: ``kernels.stack_kernel``).

Semantics: an LRU by bytes that evicts whole objects from the LRU end. An object larger than the
capacity is either bypassed (Dynamo: not inserted, nothing evicted) or flushes the cache and then
fails to insert (SGLang). With "flush" the one-pass answer is exact at every capacity; with
"bypass" the capacities below the largest object are recomputed per size tier on the trace
without the objects that do not fit (exact; one more pass per distinct entry size, on a
truncated LRU stack when the tier holds only a few entries).

Curve building: every hitting reference's required capacity is packed with its object id and a
"decides its request" bit into one int64, sorted once, and swept to cumulative counts.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..errors import UserError
from . import kernels as K
from .media import COUNTS, MODALITIES, modal_key

OVERSIZE = ("bypass", "flush")
_INF = 1 << 62
# Bypass tiers below the largest entry use a truncated LRU stack when it stays this shallow.
WINDOW_MAX_DEPTH = 48


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
    return required_capacities(ids, sizes, num_objects, compiled)[0]


def required_capacities(ids: np.ndarray, sizes: np.ndarray, num_objects: int | None = None,
                        compiled: bool | None = None, parts: int | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`required_capacity`, and the same in entries (an LRU counting entries), from one
    pass. ``parts`` (compiled only): 2 passes the trace's halves on two threads and joins them
    (``kernels.stack_join_kernel``; the same answers); default: 2 where ``kernels.threads``
    gives two or more."""
    ids = np.ascontiguousarray(ids, np.int64)
    sizes = np.ascontiguousarray(sizes, np.int64)
    n = ids.size
    m = int(ids.max()) + 1 if num_objects is None and n else (num_objects or 0)
    slots = 2 * m + 2
    if compiled is None:
        compiled = n > K.PYTHON_MAX_REFS
    if not compiled:
        out, out1 = [0] * n, [0] * n
        K.stack_kernel(ids.tolist(), sizes.tolist(), out, out1, [-1] * m, [0] * m,
                       [0] * (2 * slots + 2), [-1] * (slots + 1))
        return np.array(out, np.int64), np.array(out1, np.int64)
    parts = (2 if K.threads(n) > 1 else 1) if parts is None else parts
    req, count = np.empty(n, np.int64), np.empty(n, np.int64)
    cut = [0, n // 2, n] if parts == 2 else [0, n]
    bufs = [(np.full(m, -1, np.int64), np.zeros(m, np.int64), np.zeros(2 * slots + 2, np.int64),
             np.full(slots + 1, -1, np.int64)) for _ in cut[1:]]
    fn = K.compiled(K.stack_kernel)
    K.in_threads([partial(fn, ids[a:b], sizes[a:b], req[a:b], count[a:b], *buf)
                  for a, b, buf in zip(cut, cut[1:], bufs)], parts)
    if parts == 2:  # the second half's first references, joined to the first half's pass
        (last, osize, tree, _), (last2, osize2, _, _) = bufs
        both = (last >= 0) & (last2 >= 0)
        if not np.array_equal(osize[both], osize2[both]):  # a key's size changed: one pass
            return required_capacities(ids, sizes, m, True, 1)
        K.compiled(K.stack_join_kernel)(ids[cut[1]:], sizes[cut[1]:], req[cut[1]:],
                                        count[cut[1]:], last, osize, tree)
    return req, count


@dataclass
class Curve:
    """Hits as a step function of capacity: from ``capacity[k]`` up to ``capacity[k+1]``
    (exclusive) the cache gets ``hits[k]`` reference hits, ``hit_bytes[k]`` bytes, ``hit_tokens[k]``
    tokens and ``full_requests[k]`` requests whose images all hit. Below ``capacity[0]``: nothing.
    ``modal`` (traces with videos or audio): per modality of ``media.MODALITIES`` its hits, hit
    bytes and hit tokens, three rows each.
    """

    capacity: np.ndarray
    hits: np.ndarray
    hit_bytes: np.ndarray
    hit_tokens: np.ndarray
    full_requests: np.ndarray
    modal: np.ndarray | None = None

    def columns(self) -> dict[str, np.ndarray]:
        """Every count column by name (per-modality ones as ``media.modal_key``)."""
        out = {"hits": self.hits, "hit_bytes": self.hit_bytes, "hit_tokens": self.hit_tokens,
               "full_requests": self.full_requests}
        if self.modal is not None:
            names = [modal_key(m, c) for m in MODALITIES for c in COUNTS]
            out.update(zip(names, self.modal))
        return out

    def at(self, capacities: Sequence[float] | np.ndarray) -> dict[str, np.ndarray]:
        """The counts at each given capacity."""
        caps = np.asarray(capacities, dtype=np.float64)
        k = np.searchsorted(self.capacity, caps, side="right") - 1
        out = {}
        for name, col in self.columns().items():
            vals = np.where(k >= 0, col[np.maximum(k, 0)] if col.size else 0, 0)
            out[name] = vals.astype(np.int64)
        return out

    def smallest_capacity(self, min_hits: float) -> int | None:
        """The smallest capacity with at least ``min_hits`` hits (None: never reached)."""
        idx = np.flatnonzero(self.hits >= min_hits)
        return int(self.capacity[idx[0]]) if idx.size else None

    @classmethod
    def of(cls, cols: list[np.ndarray]) -> Curve:
        """From [capacity, hits, bytes, tokens, full requests, per-modality rows...]."""
        modal = np.array(cols[5:], np.int64) if len(cols) > 5 else None
        capacity, hits, hit_bytes, hit_tokens, full = cols[:5]
        return cls(capacity, hits, hit_bytes, hit_tokens, full, modal)


def _modal_columns(group, packed: np.ndarray, bits: int, obj_sizes: np.ndarray,
                   obj_tokens: np.ndarray, obj_mod: np.ndarray, lo: int,
                   lead: int) -> list[np.ndarray]:
    """Per modality its hits, bytes and tokens at the same breakpoints: the group kernel again
    with the modality's indicator as weights (two passes per modality, no second sort)."""
    out = []
    for m in range(len(MODALITIES)):
        ind = (obj_mod == m).astype(np.int64)
        _, a = group(packed, bits, ind, obj_sizes * ind, lo, lead)
        _, b = group(packed, bits, obj_tokens * ind, ind, lo, lead)
        out += [a[1], a[2], b[1]]
    return out


def _step_curve(req: np.ndarray, ids: np.ndarray, obj_sizes: np.ndarray, obj_tokens: np.ndarray,
                ref_row: np.ndarray | None, lo: int = 0, hi: int = _INF,
                obj_mod: np.ndarray | None = None, lead: int = 0) -> list[np.ndarray]:
    """Breakpoints of a stack curve (hit iff 0 <= req <= C) for capacities in [lo, hi).

    Per request, the reference with the largest required capacity decides when all its images
    hit. (required capacity, object, decider) are packed into one int64 and sorted by value.
    Returns [capacity, hits, bytes, tokens, full requests, per-modality rows (``obj_mod``)],
    each after ``lead`` free slots (see :func:`_join_into`).
    """
    n = req.size
    bits = max(1, int(obj_sizes.size - 1).bit_length())
    top = int(req.max()) if req.size else 0
    if top >= (1 << (62 - bits)):
        raise UserError("cache sizes too large to analyse (required capacity overflows 64 bits)")
    rows = np.zeros(0, np.int64) if ref_row is None else ref_row
    packed = K.for_size(K.pack_kernel, n)(req, ids, rows, min(hi, _INF), bits)
    if n > K.PYTHON_MAX_REFS:
        packed = K.compiled(K.radix_kernel)(packed, bits + 1)
    else:
        packed = np.sort(packed)
    group = K.for_size(K.group_kernel, n)
    caps, cols = group(packed, bits, obj_sizes, obj_tokens, lo, lead)
    if obj_mod is None:
        return [caps, *cols]
    return [caps, *cols, *_modal_columns(group, packed, bits, obj_sizes, obj_tokens, obj_mod, lo,
                                         lead)]


def curve_of(req: np.ndarray, ids: np.ndarray, obj_bytes: np.ndarray, obj_tokens: np.ndarray,
             ref_row: np.ndarray | None, obj_mod: np.ndarray | None = None) -> Curve:
    """The curve of one stack pass's required capacities (hit iff 0 <= req <= C; no bypass
    tiers), e.g. the count from :func:`required_capacities` for an LRU counting entries."""
    return Curve.of(_join([_step_curve(req, ids, obj_bytes, obj_tokens, ref_row,
                                       obj_mod=obj_mod)]))


def _join(parts: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Concatenate curve pieces, dropping a piece's first point when it changes nothing.

    Inside a piece every breakpoint adds at least one hit; only the point at a piece's lower
    bound may repeat the values before it (or be all zero at the start).
    """
    prev = np.zeros(len(parts[0]) - 1, np.int64)
    out = []
    for p in parts:
        first = np.array([c[0] for c in p[1:]], np.int64) if p[0].size else prev
        skip = 1 if p[0].size and np.array_equal(first, prev) else 0
        out.append([c[skip:] for c in p])
        if p[0].size:
            prev = np.array([c[-1] for c in p[1:]], np.int64)
    if len(out) == 1:
        return [np.ascontiguousarray(c) for c in out[0]]
    return [np.concatenate([p[i] for p in out]) for i in range(len(out[0]))]


def _join_into(below: list[np.ndarray], top: list[np.ndarray], lead: int) -> list[np.ndarray]:
    """:func:`_join` of the joined pieces ``below`` and the last piece ``top``, written after
    ``lead`` = len(below) + 1 free slots: the pieces below are copied into the free slots,
    the large last piece is not copied."""
    prev = np.array([c[-1] if c.size else 0 for c in below[1:]], np.int64)
    skip = int(np.array_equal(np.array([c[lead] for c in top[1:]], np.int64), prev))
    start = lead + skip - below[0].size
    out = []
    for low, col in zip(below, top):
        col[start:start + low.size] = low
        out.append(col[start:])
    return out


def _tier_required(ids: np.ndarray, obj_sizes: np.ndarray, sizes: np.ndarray, t_lo: int,
                   t_hi: int, smallest: int, m: int) -> np.ndarray:
    """Required capacities valid below ``t_hi`` on the trace without objects larger than t_lo."""
    depth = t_hi // smallest + 2
    if depth <= WINDOW_MAX_DEPTH:
        kern = K.for_size(K.window_kernel, ids.size)
        return kern(ids, obj_sizes, t_lo, t_hi, np.empty(ids.size, np.int64),
                    np.zeros(depth + 1, np.int64))
    keep = sizes <= t_lo
    sub = np.full(ids.size, -1, np.int64)
    sub[keep] = required_capacity(ids[keep], sizes[keep], m)
    return sub


def lru_curve(ids: np.ndarray, obj_sizes: np.ndarray, obj_tokens: np.ndarray | None = None,
              ref_row: np.ndarray | None = None, oversize: str = "bypass",
              obj_bytes: np.ndarray | None = None, obj_mod: np.ndarray | None = None) -> Curve:
    """The exact hit curve of a byte LRU over a trace, for every capacity.

    ``ids``: dense object id per reference; ``obj_sizes``/``obj_tokens``: bytes and encoder
    tokens per object; ``ref_row``: non-decreasing request index per reference (default: one
    request per reference), for the "all images of the request hit" count; ``obj_bytes``: what
    ``hit_bytes`` adds up (default ``obj_sizes``; e.g. real bytes for an LRU counting entries);
    ``obj_mod``: modality per object, for the per-modality columns.
    """
    return _curves(ids, obj_sizes, obj_tokens, ref_row, oversize, obj_bytes, obj_mod, False)[0]


def lru_curves(ids: np.ndarray, obj_sizes: np.ndarray, obj_tokens: np.ndarray | None = None,
               ref_row: np.ndarray | None = None, oversize: str = "bypass",
               obj_mod: np.ndarray | None = None) -> tuple[Curve, Curve]:
    """:func:`lru_curve`, and the curve of an LRU counting entries (capacity in entries, its
    ``hit_bytes`` in ``obj_sizes``; exact at every count), from one stack pass."""
    byte, count = _curves(ids, obj_sizes, obj_tokens, ref_row, oversize, None, obj_mod, True)
    assert count is not None
    return byte, count


def _curves(ids, obj_sizes, obj_tokens, ref_row, oversize: str, obj_bytes, obj_mod,
            entries: bool) -> tuple[Curve, Curve | None]:
    if oversize not in OVERSIZE:
        raise UserError(f"unknown oversize policy {oversize!r}; choose from {', '.join(OVERSIZE)}")
    ids = np.ascontiguousarray(ids, np.int64)
    obj_sizes = np.asarray(obj_sizes, np.int64)
    obj_tokens = np.zeros_like(obj_sizes) if obj_tokens is None else np.asarray(obj_tokens, np.int64)
    if ref_row is not None:
        ref_row = np.asarray(ref_row, np.int64)
        if ref_row.size != ids.size or (ref_row.size > 1 and (ref_row[1:] < ref_row[:-1]).any()):
            raise UserError("ref_row must give a non-decreasing request index per reference")
    if ids.size and (ids.min() < 0 or ids.max() >= obj_sizes.size):
        raise UserError("object ids must index obj_sizes")
    obj_bytes = obj_sizes if obj_bytes is None else np.asarray(obj_bytes, np.int64)
    sizes = obj_sizes[ids]
    if ids.size and sizes.min() <= 0:
        raise UserError("cache entry sizes must be positive")
    m = obj_sizes.size
    tiers = np.zeros(1, np.int64)  # entry sizes: bypass tiers between them, the last up
    if oversize == "bypass" and ids.size:
        used = np.bincount(ids, minlength=m).astype(bool)  # O(N): no sort of the trace
        tiers = np.unique(obj_sizes[used])

    def tier(t_lo: int, t_hi: int) -> list[np.ndarray]:
        # larger objects are bypassed at capacities in [t_lo, t_hi): a pass without them
        sub = _tier_required(ids, obj_sizes, sizes, t_lo, t_hi, int(tiers[0]), m)
        return _step_curve(sub, ids, obj_bytes, obj_tokens, ref_row, t_lo, t_hi, obj_mod)
    # the tiers' passes beside the whole trace's (itself on two threads where it may)
    *parts, (req, count) = K.in_threads(
        [*(partial(tier, int(a), int(b)) for a, b in zip(tiers[:-1], tiers[1:])),
         lambda: required_capacities(ids, sizes, m)], K.threads(ids.size))
    lo = int(tiers[-1])

    def byte_curve() -> Curve:
        if not parts:
            return Curve.of(_join([_step_curve(req, ids, obj_bytes, obj_tokens, ref_row, lo,
                                               obj_mod=obj_mod)]))
        below = _join(parts)  # the tiers' pieces are small: the large last one written after
        lead = below[0].size + 1
        return Curve.of(_join_into(below, _step_curve(req, ids, obj_bytes, obj_tokens, ref_row,
                                                      lo, obj_mod=obj_mod, lead=lead), lead))
    # the curve in bytes beside the one in entries
    curve, *count_curve = K.in_threads(
        [byte_curve, *([lambda: curve_of(count, ids, obj_sizes, obj_tokens, ref_row, obj_mod)]
                       if entries else [])], K.threads(ids.size))
    return curve, (count_curve[0] if entries else None)


def lru_hits(keys: Sequence | np.ndarray, sizes: Sequence[int] | np.ndarray, capacity_bytes: float,
             oversize: str = "bypass", num_objects: int | None = None) -> np.ndarray:
    """Per reference: does it hit in a byte LRU of ``capacity_bytes``? (bool array)

    ``keys``: one hashable (or int) per reference in dispatch order; ``sizes``: bytes per
    reference (a key's first size counts). ``oversize``: "bypass" or "flush" for entries larger
    than the capacity. ``num_objects``: the keys are already ids below it, each reference
    sized as its key's first (no mapping, no sort).
    """
    if oversize not in OVERSIZE:
        raise UserError(f"unknown oversize policy {oversize!r}; choose from {', '.join(OVERSIZE)}")
    ids, m = (dense_ids(keys) if num_objects is None
              else (np.asarray(keys, np.int64), int(num_objects)))
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    if sizes.size != ids.size:
        raise UserError(f"got {sizes.size} sizes for {ids.size} keys")
    if ids.size == 0:
        return np.zeros(0, bool)
    if sizes.min() < 0:
        raise UserError("entry sizes must not be negative")
    obj = object_sizes(ids, sizes) if num_objects is None else sizes
    if oversize == "bypass":
        keep = obj <= capacity_bytes
        out = np.zeros(ids.size, bool)
        req = required_capacity(ids[keep], obj[keep], m)
        out[keep] = (req >= 0) & (req <= capacity_bytes)
        return out
    req = required_capacity(ids, obj, m)
    return (req >= 0) & (req <= capacity_bytes)
