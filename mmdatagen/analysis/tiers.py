"""Dynamo's aggregated embedding cache in the analysis: two tiers, as ``caches.model.TieredCache``
runs them (the simulator's and the loader's model).

vLLM's encoder cache answers first (a budget in embedding tokens, items pinned by the requests
using them and released to a freeable list when a request completes); only its misses reach
Dynamo's connector, a byte LRU that skips entries larger than its capacity. The front does not
depend on the connector's size, so it is replayed once over the trace (``front_flags``, one
compiled pass); the connector is then a plain byte LRU over the front's misses, and the one-pass
stack curve over that stream (``lru.lru_curve``) gives every connector size at once. The
connector's counters follow: a lookup only on a front miss, evictions at any size
(:func:`evictions`), an encoder run per connector miss.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..caches.items import RequestItems
from . import kernels as K
from .trace import Trace


@dataclass(frozen=True)
class Front:
    """The front tier: vLLM's encoder cache budget in tokens, and the model's entry bytes per
    token (an item's front size is its entry bytes / bytes per token, rounded up)."""

    budget: int
    bytes_per_token: int

    def tokens(self, sizes: np.ndarray) -> np.ndarray:
        """Front sizes (tokens) of entries of ``sizes`` bytes, as ``TieredCache`` sizes them."""
        return -(-np.asarray(sizes, np.int64) // self.bytes_per_token)


def default_events(num_rows: int) -> np.ndarray:
    """One request at a time: row r looked up, then completed, before row r + 1."""
    ev = np.empty(2 * num_rows, np.int64)
    ev[0::2] = np.arange(num_rows)
    ev[1::2] = ~np.arange(num_rows)
    return ev


def front_flags(trace: Trace, tokens: np.ndarray, budget: int,
                events: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Per reference, whether vLLM's encoder cache of ``budget`` tokens holds it when its request
    is scheduled (``tokens``: front size per object), over ``events`` (row r looked up is ``r``,
    completed ``~r``; default: :func:`default_events`, one request at a time); and the front's
    counters (hits, evictions, inserts)."""
    ids = np.ascontiguousarray(trace.ids, np.int64)
    m = int(tokens.size)
    ev = np.zeros(0, np.int64) if events is None else np.asarray(events, np.int64)
    row_start = trace.row_start
    args = (ev, row_start, ids, np.asarray(tokens, np.int64), int(budget),
            np.zeros(ids.size, np.int8), np.zeros(ids.size, np.int8), np.zeros(m, np.int64),
            np.full(m, -1 << 62, np.int64), np.zeros(m, np.int64), np.full(m + 1, m, np.int64),
            np.full(m + 1, m, np.int64), np.zeros(5, np.int64))
    if ids.size > K.PYTHON_MAX_REFS:
        out = K.compiled(K.front_kernel)(*args)
        served = args[5].astype(bool)
    else:
        lists = [a.tolist() for a in args[:4]] + [args[4]] + [a.tolist() for a in args[5:]]
        out = np.asarray(K.front_kernel(*lists), np.int64)
        served = np.asarray(lists[5], bool)
    return served, {"hits": int(out[0]), "evictions": int(out[1]), "inserts": int(out[2])}


def connector_trace(trace: Trace, served: np.ndarray) -> Trace:
    """The references that reach the connector (a front miss each), rows and objects kept."""
    keep = ~served
    return Trace(trace.ids[keep], trace.ref_row[keep], trace.num_rows, trace.widths,
                 trace.heights, trace.sessions, trace.source, trace.info, trace.modality,
                 trace.media)


class Evictions:
    """The connector's evictions at any capacity, given its hits there.

    A byte LRU that skips larger entries holds, at any moment, the longest run of the most
    recently used entries (of those that fit at all) whose sizes add up to at most its
    capacity; so it ends holding that run of the final recency order, and every insert (a miss
    of an entry that fits) that is not held at the end was evicted."""

    def __init__(self, back: Trace, num_objects: int) -> None:
        self.refs = np.bincount(back.ids, minlength=num_objects)  # lookups per object
        last = np.full(num_objects, -1, np.int64)
        last[back.ids] = np.arange(back.ids.size)
        self.order = np.argsort(-last, kind="stable")[: int(np.count_nonzero(last >= 0))]

    def at(self, sizes: np.ndarray, capacity: int, hits: int) -> int:
        if capacity <= 0 or self.order.size == 0:
            return 0
        inserts = int(self.refs[sizes <= capacity].sum()) - hits
        fit = sizes[self.order]
        fit = fit[fit <= capacity]
        return inserts - int(np.searchsorted(np.cumsum(fit), capacity, side="right"))


def event_hits(items: RequestItems, kinds: np.ndarray, reqs: np.ndarray, front: Front,
               capacity: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``caches.model``'s two-tier cache (``capacity``: the connector's bytes; None: vLLM's
    encoder cache alone, ``FreeableCache``, sizes in tokens with ``front.bytes_per_token`` 1)
    replayed over cache events (``kinds[q]`` 0: request ``reqs[q]`` looks its items up; else:
    its entries are released), compiled: per request, the hits and the lookups of the cache
    the engine's counters report (the connector's, behind the front; else the front's)."""
    from .lru import lru_hits

    n, ids = len(items), items.key
    sizes = np.zeros(items.num_keys, np.int64)
    sizes[ids[::-1]] = items.size[::-1]  # a key's first size (an entry keeps it)
    trace = Trace(ids, items.owner, n, np.zeros(sizes.size), np.zeros(sizes.size))
    ev = np.where(kinds == 0, reqs, ~reqs).astype(np.int64)
    served, _ = front_flags(trace, front.tokens(sizes), front.budget, ev)
    refs = items.refs(reqs[kinds == 0])  # every lookup's items, in the events' order
    owner = trace.ref_row
    if capacity is None:
        return (np.bincount(owner[refs[served[refs]]], minlength=n),
                np.bincount(owner[refs], minlength=n))
    back = refs[~served[refs]]
    if capacity <= 0:  # the model's connector of 0 bytes is off: not even an empty entry hits
        return np.zeros(n, np.int64), np.bincount(owner[back], minlength=n)
    hit = lru_hits(ids[back], sizes[ids[back]], capacity, "bypass", sizes.size)
    return np.bincount(owner[back[hit]], minlength=n), np.bincount(owner[back], minlength=n)
