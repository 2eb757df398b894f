"""The order band of a cache prediction: the lowest and highest hits over every order in which
the server may have seen the requests, given what the client timed.

A client knows when it sent request ``i`` (``s_i``) and when the first byte of its reply came back
(``f_i``); the server looked ``i`` up at some moment in ``[s_i, f_i]``. Request ``i`` certainly
came before ``j`` when ``f_i < s_j``; otherwise their order is open. The consistent orders are
the linear extensions of this interval order (exactly the orders one moment per window
realises). A target with a later moment (entries released or present after encoding) adds one
event per request in ``[s_i, t_i]``, after its lookup.

The same machinery takes windows on another axis: ``fcfs_windows`` turns the first tokens of a
first-come-first-served engine into windows on the axis of first-token times (groups of one
engine step, ordered; moments known only in real time placed between groups), and the
prediction's log order (``--server-log``) gives points. Any windows with the interval-order
meaning above will do. Four methods, the first that applies:

1. Exact search. The events are placed one at a time; a state is the set placed so far (a
   prefix of the send order plus a few open windows past it: at most the concurrency) and the
   cache as the target's own model left it (pickled, counters zeroed). Placed sets reached with
   equal caches are one state, keeping the lowest and highest hits. The answer is exact: where
   no windows overlap there is one state per step (width 0, the exact replay). It runs while
   its work stays under ``SEARCH_BUDGET`` (moves between states, and ``APPLY_COST`` per cache
   step not remembered; it gives up at once when the pace so far says it would take twice
   that; ``hopeless``, checked by every search). Work, not seconds: the same run gives the
   same band on any machine. A second band over more orders of the same requests (bench's
   ``any_order`` beside the first-come one) skips the searches that band ran out of (``after``).
2. For vLLM's encoder cache, alone (``FreeableCache``) or in front of Dynamo's connector
   (``TieredCache``), the exact search gets an eighth of the budget; past it, two searches over
   the same placed sets with smaller states. The blow-up they avoid: a step's requests are in any
   order, so the freeable list (release order) and the connector's LRU (lookup order) hold every
   order of each step, and exact states multiply by them.

   a. Block search (``block_search``, a quarter of the budget). Each LRU (the freeable list,
      whose entry goes when an allocation finds the pinned entries, those released after it and
      itself over the budget; the connector's LRU by stack distance) is kept as blocks, the most
      recent first; a block holds chains (one event's touches, in their order) in any order: the
      events of one window share a block. A hit takes its entry out of its chain; an eviction
      keeps, block by block, what fits, and of the first block that does not fit every part some
      order of its chains keeps (whole chains, then the newest part of one: a block of its own,
      older), each a state of its own (``_cuts``). Dead entries count by size; blocks older than
      every live entry go. Pinned entries and held keys are exact. Every concrete order's state
      is one of the states its placed set holds (any order within a block included), and every
      state's hits are exact, so the band holds every order's hits; it is wider than the truth
      only where a block stands for orders no placed set reached (property-tested against brute
      force: equal on three requests).
   b. Age bound (``age_search``, half the budget, or what the searches before it left of
      seven eighths when they gave up early: their work, not their share). One state per
      placed set and pinned structure (``TIER_STATES`` before they are joined): each freeable
      and connector entry has an interval of ages (age: the entry's size plus what would go
      before it; an allocation of ``s`` evicts it iff age + ``s`` exceeds the budget); a touch
      adds its size to every entry it may be older than (``_shift``), a join takes the union
      (an entry missing in one state may be gone). A hit is certain when every age in the
      interval fits, possible when one does; the lowest counts certain hits, the highest
      possible ones. Sound by induction over events (each concrete state's ages lie in the
      intervals), loose where joins forget which of a step's entries went together.
3. Stack bound, for a single LRU whose entries are present from the lookup on (vLLM's
   processor cache, touch-first included; SGLang's set-keyed cache with its flush on an
   oversize entry). LRU's stack property: an entry ``x`` last touched by request ``u`` is still
   there when request ``v`` starts iff the distinct entries touched since (the rest of ``u``,
   every request between, ``v``'s earlier items unless present items are touched first) plus
   ``x`` fit the capacity, with no flush. For each possible consecutive pair ``u -> v`` of
   ``x``'s visits that is *yes* when even every request that may lie between fits, *no* when
   those that certainly lie between already do not, else *maybe* (exact distinct-size range
   sums, an offline merge-sort tree). A key's hits are the sum over its consecutive visits; its
   lowest and highest are searched over every order of its visits (placed sets and the last
   visit; past ``GROUP_STATES`` states, each visit's worst and best predecessor).
   Keys are bounded one by one, so the sums can only widen: ``low`` is at most, and ``high`` at
   least, any consistent order's hits.
4. Coarse bound, for the other targets past the search (FIFO, entries present after encoding,
   the two tiers past the age search): no hit is certain; an item no other request may have
   brought earlier is a certain miss.

A target that frees item by item (vLLM's encoder cache, alone or in front of Dynamo's tier:
an item goes at the end of the step whose prefill chunk passes it) is searched with each item a
request of its own (``items_apart``). Its first-come band is not made here but by
``chunked.py``, over the steps the first tokens show.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import pickle
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..caches.items import RequestItems

GROUP_STATES = 20_000  # states of the search over one key's entangled visits, else a bound
YES, MAYBE, NO = 2, 1, 0


@dataclass(frozen=True)
class Band:
    """Lowest and highest hits (one pair per weight vector) and how they were found."""

    bounds: list[tuple[int, int]]
    method: str
    known_order: bool


def known_order(s: np.ndarray, f: np.ndarray) -> bool:
    """True when every pair of windows is ordered (``s`` ascending)."""
    if s.size < 2:
        return True
    run_max = np.maximum.accumulate(f[:-1])
    return bool(np.all(run_max < s[1:]))


# -- distinct-size range sums ------------------------------------------------------------------
class RangeSums:
    """``sum(l, r)``: the total size of the distinct keys occurring in requests ``l..r``
    (send positions), for many ranges at once. An occurrence counts when the previous one of
    its key lies before ``l``; a merge-sort tree over the occurrences (sorted by position, each
    level's blocks sorted by previous position) answers all ranges with numpy."""

    def __init__(self, pos: np.ndarray, prev: np.ndarray, size: np.ndarray, n: int) -> None:
        self.pos, self.n = pos, n
        self.cum = np.concatenate([[0], np.cumsum(size, dtype=np.int64)])
        self.levels: list[tuple[np.ndarray, np.ndarray]] = []
        idx = np.arange(pos.size, dtype=np.int64)
        k = 0
        while (1 << k) <= max(1, pos.size):
            comb = (idx >> k) * (n + 2) + (prev + 1)
            order = np.argsort(comb, kind="stable")
            self.levels.append((comb[order],
                                np.concatenate([[0], np.cumsum(size[order], dtype=np.int64)])))
            k += 1

    def __call__(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        empty = lo > hi
        lo_c = np.where(empty, 0, lo)
        cnt_r = np.searchsorted(self.pos, np.where(empty, -1, hi), side="right")
        cnt_l = np.searchsorted(self.pos, lo_c - 1, side="right")
        out = -self.cum[cnt_l]  # occurrences before l all have prev < l
        for k, (comb, cum) in enumerate(self.levels):
            has = (cnt_r >> k) & 1 == 1
            if not has.any():
                continue
            block = (cnt_r[has] >> (k + 1)) << 1
            base = block * (self.n + 2)
            a = np.searchsorted(comb, base, side="left")
            b = np.searchsorted(comb, base + lo_c[has], side="right")
            out[has] += cum[b] - cum[a]
        return np.where(empty, 0, out)


# -- the requests as the stack method sees them -------------------------------------------------
@dataclass
class _Seq:
    """Counted requests in send order: items as key ids, windows, overlaps."""

    items: list[list[tuple[int, int]]]  # (key id, size) per request, in item order
    unit: list[int]  # hits one item hit stands for (a set-keyed entry: the request's images)
    s: np.ndarray
    f: np.ndarray
    capacity: int
    touch_first: bool
    flush: bool

    def __post_init__(self) -> None:
        n = len(self.items)
        self.n = n
        self.first_after = np.searchsorted(self.s, self.f, side="right")  # I: first s_k > f_u
        self.last_before = self.first_after - 1  # J: last s_k <= f_v
        self.ov_before = _open_before(self.s, self.f)
        self.flush_req = np.array([self.flush and any(sz > self.capacity for _, sz in it)
                                   for it in self.items], dtype=np.int64)
        self.flush_cum = np.concatenate([[0], np.cumsum(self.flush_req)])
        self.visits: dict[int, list[int]] = {}
        for p, it in enumerate(self.items):
            for kid in dict.fromkeys(k for k, _ in it):
                self.visits.setdefault(kid, []).append(p)
        self.size_of = {k: sz for it in self.items for k, sz in it}

    def fits(self, size: int) -> bool:
        """Whether an entry of ``size`` is ever kept (an oversize one is bypassed or flushes)."""
        return 0 < self.capacity and size <= self.capacity

    def occurs(self, kid: int, lo: int, hi: int) -> int:
        """How many requests in ``lo..hi`` hold ``kid``."""
        if lo > hi:
            return 0
        vis = self.visits[kid]
        return bisect.bisect_right(vis, hi) - bisect.bisect_left(vis, lo)

    def flushes(self, lo: int, hi: int) -> int:
        return 0 if lo > hi else int(self.flush_cum[hi + 1] - self.flush_cum[lo])


def _open_before(s: np.ndarray, f: np.ndarray) -> list[list[int]]:
    """Per request ``v``: the earlier-sent requests whose window is still open at ``s_v``."""
    heap: list[tuple[int, int]] = []
    out: list[list[int]] = []
    for p in range(s.size):
        while heap and heap[0][0] < s[p]:
            heapq.heappop(heap)
        out.append(sorted(k for _, k in heap))
        heapq.heappush(heap, (int(f[p]), p))
    return out


def _range_sums(seq: _Seq) -> RangeSums:
    pos, prev, size = [], [], []
    last: dict[int, int] = {}
    for p, it in enumerate(seq.items):
        for kid, sz in _distinct(it).items():
            if seq.fits(sz):
                pos.append(p)
                prev.append(last.get(kid, -1))
                size.append(sz)
                last[kid] = p
    return RangeSums(np.array(pos, np.int64), np.array(prev, np.int64),
                     np.array(size, np.int64), seq.n)


def _distinct(items: Sequence[tuple[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for kid, sz in items:
        out.setdefault(kid, sz)
    return out


# -- one key's visits: who may precede whom ------------------------------------------------------
@dataclass
class _Key:
    kid: int
    size: int
    vis: list[int]  # send positions of the requests holding the key
    preds: list[list[int]]  # per visit: the visits that may come right before it (indexes)
    certain_pred: list[bool]  # per visit: some visit certainly comes before it
    groups: list[tuple[int, int]]  # [start, end) of visits entangled with each other
    gap: dict[tuple[int, int], int]  # (pred, visit) -> YES/MAYBE/NO: present at the visit
    s: list[int]  # the visits' windows
    f: list[int]


def _key(seq: _Seq, kid: int) -> _Key:
    """Possible immediate predecessors among the key's visits: ``u`` may come right before
    ``v`` iff ``u`` may come before ``v`` and no visit certainly lies between them, i.e.
    ``s_u <= f_v`` and ``f_u >= t_v``, ``t_v`` the latest send among the visits certainly
    before ``v``."""
    vis = seq.visits[kid]
    s, f = seq.s, seq.f
    preds: list[list[int]] = []
    certain: list[bool] = []
    heap: list[tuple[int, int]] = []
    alive: list[int] = []
    t = None
    for j, p in enumerate(vis):
        while heap and heap[0][0] < s[p]:
            w = heapq.heappop(heap)[1]
            t = s[vis[w]] if t is None else max(t, s[vis[w]])
        if t is not None:
            alive = [u for u in alive if f[vis[u]] >= t]
        close = f[p]
        later = []
        for u in range(j + 1, len(vis)):
            if s[vis[u]] > close:
                break
            later.append(u)
        preds.append(alive + later)
        certain.append(t is not None)
        alive.append(j)
        heapq.heappush(heap, (int(f[p]), j))
    groups, start, reach = [], 0, None
    for j, p in enumerate(vis):
        if reach is not None and reach < s[p]:
            groups.append((start, j))
            start = j
        reach = f[p] if reach is None else max(reach, f[p])
    groups.append((start, len(vis)))
    return _Key(kid, seq.size_of[kid], vis, preds, certain, groups, {},
                [int(s[p]) for p in vis], [int(f[p]) for p in vis])


# -- whether x is still present when v starts, given u came right before -------------------------
def _touched(seq: _Seq, p: int, kid: int, after: bool) -> tuple[dict[int, int], bool]:
    """The keys request ``p`` touches after ``kid``'s last item (``after``) or before its
    first, with their sizes (kept entries only), and whether one of them flushes."""
    it = seq.items[p]
    idx = [i for i, (k, _) in enumerate(it) if k == kid]
    part = it[idx[-1] + 1:] if after else it[:idx[0]]
    keys = {k: sz for k, sz in part if k != kid and seq.fits(sz)}
    return keys, seq.flush and any(sz > seq.capacity for _, sz in part)


def _gap_ranges(seq: _Seq, us: np.ndarray, vs: np.ndarray) -> dict[str, np.ndarray]:
    """Per pair (u, v): the ranges the fast and the exact tests sum over."""
    first_open = np.array([min([p, *seq.ov_before[p]]) for p in range(seq.n)], np.int64)
    lo_c = seq.first_after[us]
    stop = np.array([next((k for k in seq.ov_before[v] if k >= lo), v)
                     for v, lo in zip(vs.tolist(), lo_c.tolist())], np.int64)
    return {"s_lo": np.minimum(first_open[us], us), "s_hi": np.maximum(vs, seq.last_before[vs]),
            "c_lo": lo_c, "c_hi": stop - 1, "core_lo": us + 1, "core_hi": vs - 1,
            "cert_hi": vs - 1}


def _gap_outcomes(seq: _Seq, keys: list[_Key]) -> None:
    """Fill every key's ``gap``: a fast decision from two ranges (a superset of the requests
    that may lie between, a subset of those that certainly do), the exact sets otherwise."""
    pairs = [(k, ju, jv) for k in keys for jv in range(len(k.vis)) for ju in k.preds[jv]]
    if not pairs:
        return
    us = np.array([k.vis[ju] for k, ju, _ in pairs], np.int64)
    vs = np.array([k.vis[jv] for k, _, jv in pairs], np.int64)
    r = _gap_ranges(seq, us, vs)
    sums = _range_sums(seq)
    d_sup, d_sub = sums(r["s_lo"], r["s_hi"]), sums(r["c_lo"], r["c_hi"])
    d_core, d_cert = sums(r["core_lo"], r["core_hi"]), sums(r["c_lo"], r["cert_hi"])
    for n, (k, ju, jv) in enumerate(pairs):
        room = seq.capacity - k.size
        u, v = int(us[n]), int(vs[n])
        if d_sup[n] - k.size <= room and not seq.flushes(int(r["s_lo"][n]), int(r["s_hi"][n])):
            out = YES
        elif d_sub[n] > room or seq.flushes(int(r["c_lo"][n]), int(r["c_hi"][n])):
            out = NO
        else:
            out = _exact_gap(seq, k, u, v, int(d_core[n]), int(d_cert[n]))
        k.gap[(ju, jv)] = out


def _ends(seq: _Seq, x: int, u: int, v: int) -> tuple[dict[int, int], bool]:
    """What the pair's own requests touch between the two items: the rest of ``u``, and
    ``v``'s earlier items unless a request's present items are touched first."""
    ends: dict[int, int] = {}
    flush = False
    for p, after in ((u, True), (v, False)):
        if after or not seq.touch_first:
            keys, fl = _touched(seq, p, x, after)
            ends.update(keys)
            flush |= fl
    return ends, flush


def _may_between(seq: _Seq, x: int, u: int, v: int, d_core: int, ends: dict[int, int]
                 ) -> tuple[int, bool]:
    """Size of the distinct entries that may be touched between, and whether a flush may
    happen: the core ``(u, v)`` plus the requests around it whose windows are open (sent after
    ``u``'s window opened and before ``v``'s closed; none holding ``x``: it would lie between)."""
    core_lo, core_hi = u + 1, v - 1
    extra = set(seq.ov_before[u]) | set(range(v + 1, int(seq.last_before[v]) + 1))
    extra = {q for q in extra if q not in (u, v) and not core_lo <= q <= core_hi
             and seq.f[q] >= seq.s[u] and seq.s[q] <= seq.f[v]
             and all(kk != x for kk, _ in seq.items[q])}
    more = dict(ends)
    for q in extra:
        more.update((kk, sz) for kk, sz in seq.items[q] if kk != x and seq.fits(sz))
    total = d_core - (seq.size_of[x] if seq.occurs(x, core_lo, core_hi) else 0)
    total += sum(sz for kk, sz in more.items() if not seq.occurs(kk, core_lo, core_hi))
    flush = seq.flushes(core_lo, core_hi) > 0 or any(seq.flush_req[q] for q in extra)
    return total, flush


def _certainly_between(seq: _Seq, u: int, v: int, d_cert: int, ends: dict[int, int]
                       ) -> tuple[int, bool]:
    """Size of the distinct entries certainly touched between (the requests whose window
    opened after ``u``'s closed and closed before ``v``'s opened), and whether one flushes."""
    lo, hi = int(seq.first_after[u]), v - 1
    removed = [q for q in seq.ov_before[v] if lo <= q <= hi]
    held: dict[int, int] = {}
    for q in removed:
        for kk in _distinct(seq.items[q]):
            held[kk] = held.get(kk, 0) + 1
    total = d_cert - sum(seq.size_of[kk] for kk, c in held.items()
                         if seq.fits(seq.size_of[kk]) and seq.occurs(kk, lo, hi) == c)
    total += sum(sz for kk, sz in ends.items() if seq.occurs(kk, lo, hi) <= held.get(kk, 0))
    flush = seq.flushes(lo, hi) - sum(int(seq.flush_req[q]) for q in removed) > 0
    return total, flush


def _exact_gap(seq: _Seq, k: _Key, u: int, v: int, d_core: int, d_cert: int) -> int:
    """The pair's outcome from the exact sets of requests that may, and that certainly, lie
    between."""
    room = seq.capacity - k.size
    ends, flush_ends = _ends(seq, k.kid, u, v)
    may, may_flush = _may_between(seq, k.kid, u, v, d_core, ends)
    if not (flush_ends or may_flush) and may <= room:
        return YES
    certain, cert_flush = _certainly_between(seq, u, v, d_cert, ends)
    return NO if flush_ends or cert_flush or certain > room else MAYBE


# -- inside the visiting request ------------------------------------------------------------------
def _repeat_hits(seq: _Seq, p: int, kid: int) -> int:
    """Hits of the key's second and later items in request ``p`` (fixed by the request alone:
    a repeat hits unless the items between evicted or flushed it)."""
    it = seq.items[p]
    idx = [i for i, (k, _) in enumerate(it) if k == kid]
    size = seq.size_of[kid]
    if not seq.fits(size):
        return 0
    hits = 0
    for a, b in itertools.pairwise(idx):
        part = it[a + 1:b]
        between = sum({k: sz for k, sz in part if k != kid and seq.fits(sz)}.values())
        flushed = seq.flush and any(sz > seq.capacity for _, sz in part)
        hits += int(not flushed and between + size <= seq.capacity)
    return hits


def _within(seq: _Seq, p: int, kid: int, present: Callable[[int, int], tuple[bool, bool]]
            ) -> int:
    """With touch-first: the key, present when request ``p`` starts, still present at its
    first item (only a request whose own entries exceed the capacity can evict it: the keys
    touched after it are the earlier items and the present keys whose last item is later).
    ``present(kid, p)``: (possibly, certainly) present at the start."""
    if not seq.touch_first:
        return YES
    distinct = _distinct(seq.items[p])
    if sum(sz for sz in distinct.values() if seq.fits(sz)) <= seq.capacity:
        return YES
    before, _ = _touched(seq, p, kid, after=False)
    after, _ = _touched(seq, p, kid, after=True)
    later = {k: sz for k, sz in after.items() if k not in before}
    room = seq.capacity - seq.size_of[kid]
    upper = sum(before.values()) + sum(sz for k, sz in later.items() if present(k, p)[0])
    lower = sum(before.values()) + sum(sz for k, sz in later.items() if present(k, p)[1])
    return YES if upper <= room else NO if lower > room else MAYBE


# -- a key's lowest and highest hits over the orders of its visits --------------------------------
Bounds = dict[int, tuple[float, float]]  # last visit -> (lowest, highest) so far


def _enter(prev: Bounds | None, entry: int, val: Callable[[int, int], tuple[float, float]]
           ) -> tuple[float, float]:
    if prev is None:
        return 0.0, 0.0
    cands = [(lo + val(u, entry)[0], hi + val(u, entry)[1]) for u, (lo, hi) in prev.items()]
    return min(c[0] for c in cands), max(c[1] for c in cands)


def _group_search(key: _Key, a: int, b: int, prev: Bounds | None,
                  val: Callable[[int, int], tuple[float, float]]) -> Bounds | None:
    """Every order of the visits ``a..b-1`` (a visit after those certainly before it), from
    each possible entry: a search over placed sets (a first unplaced visit and the placed ones
    past it: at most as many as may be open at once) and the last visit placed. None when
    the states exceed ``GROUP_STATES``."""
    layer: dict[tuple[int, frozenset[int], int], tuple[float, float]] = {}
    for v in _visits_ready(key, a, b, frozenset()):
        layer[(*_placed_after(a, frozenset(), v), v)] = _enter(prev, v, val)
    for _ in range(b - a - 1):
        nxt: dict[tuple[int, frozenset[int], int], tuple[float, float]] = {}
        for (first, extra, last), (lo, hi) in layer.items():
            for v in _visits_ready(key, first, b, extra):
                if last not in key.preds[v]:
                    continue
                vlo, vhi = val(last, v)
                state = (*_placed_after(first, extra, v), v)
                cur = nxt.get(state)
                nxt[state] = (lo + vlo, hi + vhi) if cur is None else (
                    min(cur[0], lo + vlo), max(cur[1], hi + vhi))
        if len(nxt) > GROUP_STATES:
            return None
        layer = nxt
    out: Bounds = {}
    for (_, _, last), (lo, hi) in layer.items():
        cur = out.get(last)
        out[last] = (lo, hi) if cur is None else (min(cur[0], lo), max(cur[1], hi))
    return out


def _visits_ready(key: _Key, first: int, end: int, extra: frozenset[int]) -> list[int]:
    """Visits that may come next: unplaced, after every visit certainly before them."""
    out = []
    for v in range(first, end):
        if key.s[v] > key.f[first]:
            break
        if v in extra or any(u not in extra and key.f[u] < key.s[v] for u in range(first, v)):
            continue
        out.append(v)
    return out


def _group_bound(key: _Key, a: int, b: int, prev: Bounds | None,
                 val: Callable[[int, int], tuple[float, float]]) -> Bounds:
    """A group too large to search: every visit but the entry gets its worst (best)
    predecessor in the group; the entry and the exit are any that may be first and last."""
    members = range(a, b)
    first_close = min(key.f[a:b])
    last_open = max(key.s[a:b])
    entries = [v for v in members if key.s[v] <= first_close]
    exits = [v for v in members if key.f[v] >= last_open]
    worst = {v: min((val(u, v)[0] for u in key.preds[v] if a <= u < b), default=0.0)
             for v in members}
    best = {v: max((val(u, v)[1] for u in key.preds[v] if a <= u < b), default=0.0)
            for v in members}
    starts = [_enter(prev, e, val) for e in entries]
    lo = min(st[0] for st in starts) + sum(worst.values()) - max(worst[e] for e in entries)
    hi = max(st[1] for st in starts) + sum(best.values()) - min(best[e] for e in entries)
    return {x: (lo, hi) for x in exits}


def _key_bounds(key: _Key, val: Callable[[int, int], tuple[float, float]]) -> tuple[float, float]:
    """The key's lowest and highest first-item hits over the orders of its visits."""
    prev: Bounds | None = None
    for a, b in key.groups:
        prev = _group_search(key, a, b, prev, val) or _group_bound(key, a, b, prev, val)
    assert prev
    return min(lo for lo, _ in prev.values()), max(hi for _, hi in prev.values())


# -- the stack method ---------------------------------------------------------------------------
def _presence(keys: dict[int, _Key]) -> Callable[[int, int], tuple[bool, bool]]:
    """(possibly, certainly) present when request ``p`` starts, for a key it holds."""
    memo: dict[tuple[int, int], tuple[bool, bool]] = {}

    def present(kid: int, p: int) -> tuple[bool, bool]:
        if (kid, p) not in memo:
            k = keys.get(kid)
            if k is None:  # never kept
                memo[(kid, p)] = (False, False)
            else:
                j = bisect.bisect_left(k.vis, p)
                outs = [k.gap[(u, j)] for u in k.preds[j]]
                memo[(kid, p)] = (any(o != NO for o in outs),
                                  k.certain_pred[j] and all(o == YES for o in outs))
        return memo[(kid, p)]
    return present


def _values(k: _Key, within: dict[tuple[int, int], int], unit: np.ndarray
            ) -> Callable[[int, int], tuple[float, float]]:
    """A pair's (lowest, highest) hits: the visit's weight when the key is present at its
    first item (certainly / possibly), else 0."""
    def val(u: int, v: int) -> tuple[float, float]:
        o = min(k.gap[(u, v)], within[(k.kid, v)])
        wv = float(unit[k.vis[v]])
        return (wv if o == YES else 0.0), (wv if o != NO else 0.0)
    return val


def stack_band(seq: _Seq, weights: Sequence[np.ndarray]) -> list[tuple[int, int]]:
    """Lowest and highest hits per weight vector (a weight per send position) by the stack
    method (module docstring)."""
    keys = {kid: _key(seq, kid) for kid in seq.visits if seq.fits(seq.size_of[kid])}
    _gap_outcomes(seq, list(keys.values()))
    present = _presence(keys)
    within = {(kid, j): _within(seq, p, kid, present)
              for kid, k in keys.items() for j, p in enumerate(k.vis) if k.preds[j]}
    repeats = {(kid, p): _repeat_hits(seq, p, kid) for kid, k in keys.items() for p in k.vis}
    out = []
    for w in weights:
        unit = np.asarray(seq.unit, np.float64) * np.asarray(w, np.float64)
        lo_total = hi_total = 0.0
        for kid, k in keys.items():
            lo, hi = _key_bounds(k, _values(k, within, unit))
            rep = sum(repeats[(kid, p)] * float(unit[p]) for p in k.vis)
            lo_total += lo + rep
            hi_total += hi + rep
        out.append((round(lo_total), round(hi_total)))
    return out


# -- the exact search: every consistent order, equal cache states merged ---------------------------
SEARCH_BUDGET = 20_000_000  # work units of the exact search (about 10 s here) before the bounds
APPLY_COST = 30  # units of a cache step not remembered (a remembered one, a move, costs 1)
MEMO = 200_000  # remembered cache steps (equal states reached from different placed sets)
COUNTERS = ("queries", "hits", "misses", "evictions", "inserts")
Event = tuple[int, int, int, int]  # (window low, window high, kind, send position)


def _spend(spent: list[int] | None, work: int) -> None:
    """Adds a search's ``work`` to ``spent`` (the searches of one band share its budget)."""
    if spent is not None:
        spent.append(work)


def hopeless(work: int, step: int, events: int, budget: int) -> bool:
    """Whether a search that did ``work`` units over its first ``step + 1`` of ``events``
    steps would, at that pace, take over twice its ``budget``: it gives up at once, and the
    next method answers (every search checks this after each step; work, not seconds)."""
    return work + work / (step + 1) * (events - step - 1) > 2 * budget


class _Head(list):
    """The first events of a longer list (``total`` events): a search run over it answers as
    over the whole list while it needs no event past the head, and raises ``_Truncated`` when
    it does (``order_band`` then builds the whole list)."""

    def __init__(self, events: Sequence[Event], total: int) -> None:
        super().__init__(events)
        self.total = total


class _Truncated(Exception):
    """A search over a ``_Head`` needed an event past it."""


def _count(ev: Sequence[Event]) -> int:
    """The number of events of the whole list ``ev`` is (or is the head of)."""
    return ev.total if isinstance(ev, _Head) else len(ev)


def _ready(ev: Sequence[Event], first: int, extra: frozenset[int]) -> list[int]:
    """Events that may come next after ``0..first-1`` and ``extra``: not placed, every event
    whose window closed before theirs opened placed, and a later moment after its lookup."""
    if first >= len(ev):
        raise _Truncated  # past a head (in a whole list every step has an unplaced event)
    out = []
    close = ev[first][1]
    for q in range(first, len(ev)):
        lo_q = ev[q][0]
        if lo_q > close:
            break  # the first unplaced event certainly comes before this one and all later
        if q in extra:
            continue
        if any(k not in extra and ev[k][1] < lo_q for k in range(first, q)):
            continue
        if ev[q][2] and not _placed(ev, q, first, extra):
            continue
        out.append(q)
    else:
        if len(ev) < _count(ev):
            raise _Truncated  # the events past the head may be ready too
    return out


def _placed(ev: Sequence[Event], q: int, first: int, extra: frozenset[int]) -> bool:
    """Whether the lookup of the request of later-moment event ``q`` is placed."""
    k = next(k for k in range(q - 1, -1, -1) if ev[k][3] == ev[q][3] and ev[k][2] == 0)
    return k < first or k in extra


def _quiet(cache: Any) -> None:
    """Zero the counters (the search keeps hits itself), so equal states pickle equally."""
    for obj in (cache, *(v for v in vars(cache).values() if hasattr(v, "lookup"))):
        for name in COUNTERS:
            setattr(obj, name, 0)


def exact_search(ev: Sequence[Event], items: Sequence[Sequence[tuple[Hashable, int]]],
                 gain: np.ndarray, factory: Callable[[], Any], fail: Sequence[bool],
                 budget: int = SEARCH_BUDGET, spent: list[int] | None = None,
                 last: dict[Hashable, int] | None = None) -> list[tuple[int, int]] | None:
    """Lowest and highest hits (``gain[w, p]``: what a hit of request ``p``'s items is worth
    under weight vector ``w``) over every order of the events ``ev`` (sorted by window
    low) consistent with their windows, by a search over placed sets that keeps one copy of
    equal cache states (the target's own model); None past ``budget`` units of work (the
    work done goes into ``spent``; ``last``: ``_last_lookup(ev, items)`` if at hand)."""
    step_of = _stepper(ev, items, fail, factory, last)
    half = gain.shape[0]
    cols = _Gains(gain)
    # placed set -> cache state id -> (lowest per weight..., highest per weight...)
    layer: dict[tuple[int, frozenset[int]], dict[int, tuple[float, ...]]] = {
        (0, frozenset()): {step_of.start: (0.0,) * (2 * half)}}
    moves = 0
    try:
        for step in range(_count(ev)):
            nxt: dict[tuple[int, frozenset[int]], dict[int, tuple[float, ...]]] = {}
            for (first, extra), states in layer.items():
                for q in _ready(ev, first, extra):
                    placed = _placed_after(first, extra, q)
                    _place(step_of, states, q, placed[0], cols[ev[q][3]],
                           nxt.setdefault(placed, {}))
                    moves += len(states)
                if moves + APPLY_COST * step_of.applied > budget:
                    return None
            layer = nxt
            if hopeless(moves + APPLY_COST * step_of.applied, step, _count(ev), budget):
                return None
            if len(step_of.states) > MEMO:
                layer = step_of.compact(layer)
    finally:
        _spend(spent, moves + APPLY_COST * step_of.applied)
    vals = [v for states in layer.values() for v in states.values()]
    return [(round(min(v[w] for v in vals)), round(max(v[half + w] for v in vals)))
            for w in range(half)]


class _Gains:
    """Per request, what a hit is worth under each weight vector (a column of ``gain``), made
    when a search first places the request: a search that gives up early makes few."""

    def __init__(self, gain: np.ndarray) -> None:
        self.gain = gain
        self.made: dict[int, tuple[float, ...]] = {}

    def __getitem__(self, p: int) -> tuple[float, ...]:
        col = self.made.get(p)
        if col is None:
            col = self.made[p] = tuple(self.gain[:, p].tolist())
        return col


def _place(step_of: _Stepper, states: dict[int, tuple[float, ...]], q: int, first: int,
           worth: tuple[float, ...], into: dict[int, tuple[float, ...]]) -> None:
    """Event ``q`` after each of ``states``, merged into ``into`` (lowest and highest)."""
    half = len(worth)
    for sid, val in states.items():
        new_sid, got = step_of(sid, q, first)
        if got:
            add = tuple(got * g for g in worth) * 2
            val = tuple(v + a for v, a in zip(val, add))
        cur = into.get(new_sid)
        into[new_sid] = val if cur is None else (
            tuple(map(min, cur[:half], val[:half])) + tuple(map(max, cur[half:], val[half:])))


def _placed_after(first: int, extra: frozenset[int], q: int) -> tuple[int, frozenset[int]]:
    extra = extra | {q}
    while first in extra:
        extra = extra - {first}
        first += 1
    return first, extra


class _Stepper:
    """One event applied to a cache state (states are interned: an id each): the new state
    and the hits it scored. Memoised, since many placed sets share a cache state. This one
    keeps the target's model pickled."""

    def __init__(self, ev: Sequence[Event], items: Sequence[Sequence[tuple[Hashable, int]]],
                 fail: Sequence[bool], start: Any) -> None:
        self.ev, self.items, self.fail = ev, items, fail
        self.memo: dict[tuple[int, int], tuple[int, int]] = {}
        self.applied = 0  # cache steps taken (not remembered)
        self.settled: dict[tuple[int, int], int] = {}
        self.ids: dict[Hashable, int] = {}
        self.states: list[Hashable] = []
        self.start = self.intern(self.initial(start))

    def initial(self, cache: Any) -> Hashable:
        return pickle.dumps(cache)

    def intern(self, state: Hashable) -> int:
        sid = self.ids.get(state)
        if sid is None:
            sid = self.ids[state] = len(self.states)
            self.states.append(state)
        return sid

    def apply(self, state: Hashable, q: int) -> tuple[Hashable, int]:
        assert isinstance(state, bytes)
        cache = pickle.loads(state)
        got = self.run(cache, q)
        _quiet(cache)
        return pickle.dumps(cache), got

    def run(self, cache: Any, q: int) -> int:
        _, _, kind, p = self.ev[q]
        if kind == 0:
            return sum(cache.lookup(p, self.items[p]))
        (cache.abort if self.fail[p] else cache.finish)(p)
        return 0

    def settle(self, state: Hashable, first: int) -> Hashable:
        """The state as the placed set starting at event ``first`` needs it."""
        return state

    def compact(self, layer: dict[Any, dict[int, tuple[float, ...]]]
                ) -> dict[Any, dict[int, tuple[float, ...]]]:
        """Forget every state the layer no longer holds (and the memos): new ids."""
        old, self.ids, self.states = self.states, {}, []
        self.memo.clear()
        self.settled.clear()
        return {placed: {self.intern(old[sid]): val for sid, val in states.items()}
                for placed, states in layer.items()}

    def __call__(self, sid: int, q: int, first: int) -> tuple[int, int]:
        hit = self.memo.get((sid, q))
        if hit is None:
            if len(self.memo) >= MEMO:
                self.memo.clear()
                self.settled.clear()
            state, got = self.apply(self.states[sid], q)
            self.applied += 1
            hit = self.memo[(sid, q)] = (self.intern(state), got)
        out = self.settled.get((hit[0], first))
        if out is None:
            out = self.settled[(hit[0], first)] = self.intern(
                self.settle(self.states[hit[0]], first))
        return out, hit[1]


_GONE = object()  # an anonymous entry's label: (_GONE, its rank among them)


class _LruStepper(_Stepper):
    """For an LRU or FIFO whose entries are present from the lookup on, whose stack property
    (an entry survives iff what was stored after it, plus itself, fits) makes a smaller state
    enough: the entries from the next to be evicted, where a run of entries no unplaced request
    holds counts only by its total size (one anonymous entry) and the runs below the deepest
    entry still wanted are dropped, so more placed sets share a state. The cache is the
    target's own model, loaded with each state (``OrderedCache.load``)."""

    def __init__(self, ev: Sequence[Event], items: Sequence[Sequence[tuple[Hashable, int]]],
                 fail: Sequence[bool], start: Any, factory: Callable[[], Any],
                 last: dict[Hashable, int] | None = None) -> None:
        self.cache = factory()
        self.last = _last_lookup(ev, items) if last is None else last
        super().__init__(ev, items, fail, start)

    def initial(self, cache: Any) -> Hashable:
        return ()

    def apply(self, state: Hashable, q: int) -> tuple[Hashable, int]:
        assert isinstance(state, tuple)
        self.cache.load(state)
        got = self.run(self.cache, q)
        return self.cache.entries(), got

    def settle(self, state: Hashable, first: int) -> Hashable:
        assert isinstance(state, tuple)
        return _anonymous_runs(state, self.last, first)


def _anonymous_runs(entries: tuple, last: dict[Hashable, int], first: int) -> tuple:
    """Ordered entries (key, size), each run of entries no event from ``first`` on looks up
    as one anonymous entry of their total size (evicted before any later entry, it acts as
    room: the live entries behave the same)."""
    out: list[tuple[Hashable, int]] = []
    run = 0
    for key, size in reversed(entries):  # from the most recent
        if last.get(key, -1) < first:  # no unplaced request holds it
            run += size
            continue
        if run:
            out.append(((_GONE, len(out)), run))
            run = 0
        out.append((key, size))
    if run:
        out.append(((_GONE, len(out)), run))
    return tuple(reversed(out))


class _TierStepper(_LruStepper):
    """For vLLM's encoder cache alone or in front of Dynamo's connector (``entries`` /
    ``load`` of ``FreeableCache`` and ``TieredCache``): the freeable list and the connector's
    LRU reduced as an LRU's state is (anonymous runs of dead entries); pinned entries and the
    held keys stay as they are (their releases are still to come)."""

    def initial(self, cache: Any) -> Hashable:
        return cache.entries()

    def settle(self, state: Hashable, first: int) -> Hashable:
        assert isinstance(state, tuple)
        if len(state) == 2:  # a TieredCache: (front, back)
            return self.settle(state[0], first), _anonymous_runs(state[1], self.last, first)
        freeable, pinned, held = state
        return _anonymous_runs(freeable, self.last, first), pinned, held


def _stepper(ev: Sequence[Event], items: Sequence[Sequence[tuple[Hashable, int]]],
             fail: Sequence[bool], factory: Callable[[], Any],
             last: dict[Hashable, int] | None = None) -> _Stepper:
    from ..caches import OrderedCache
    from ..caches.model import FreeableCache, TieredCache

    start = factory()
    _quiet(start)
    if type(start) is OrderedCache and start.insert_on_lookup:
        return _LruStepper(ev, items, fail, start, factory, last)
    if type(start) in (FreeableCache, TieredCache):
        return _TierStepper(ev, items, fail, start, factory, last)
    return _Stepper(ev, items, fail, start)


# -- vLLM's encoder cache and Dynamo's two tiers: a search over blocks ------------------------------
Chain = tuple[tuple[Hashable, int], ...]  # one event's entries (key, size), oldest first
Block = frozenset[tuple[Chain, int]]  # chains in any order, each with its multiplicity
BLOCK_COST, MOVE_COST = 200, 4  # work units of a block step (not remembered) and of a move
KEPT_BRANCHES = 2_000  # outcomes of one eviction (and 20 times the parts tried) before giving up
DEAD = None  # the key of a dead entry (no unplaced lookup holds it: it counts by size)


def _block(chains: Sequence[Chain]) -> Block:
    counts: dict[Chain, int] = {}
    for c in chains:
        if c:
            counts[c] = counts.get(c, 0) + 1
    return frozenset(counts.items())


def _chains(block: Block) -> list[Chain]:
    """The block's chains, each as often as it occurs, in a fixed order."""
    return sorted((c for c, n in block for _ in range(n)), key=repr)


@dataclass(frozen=True)
class _Lru:
    """An LRU (by size) as blocks, the most recent first. A block holds chains (one event's
    touches in their order) in any order: the events whose order is open share a block.
    ``open_hi``: the latest window end among the first block's events (None: closed); an
    event whose window opens after it starts a new block."""

    blocks: tuple[Block, ...] = ()
    open_hi: int | None = None

    def find(self, key: Hashable) -> tuple[int, int] | None:
        """(block, size) of ``key``, None when it is not there."""
        for i, block in enumerate(self.blocks):
            for chain, _ in block:
                for k, sz in chain:
                    if k == key:
                        return i, sz
        return None

    def remove(self, i: int, key: Hashable) -> _Lru:
        block = _block([tuple(e for e in c if e[0] != key) for c in _chains(self.blocks[i])])
        keep = (block,) if block or i == 0 else ()
        return _Lru(self.blocks[:i] + keep + self.blocks[i + 1:], self.open_hi)

    def add(self, chain: Chain, lo: int, hi: int) -> _Lru:
        """One event's touches (window ``[lo, hi]``), in their order: into the open block."""
        if not chain:
            return self
        if self.open_hi is None or lo > self.open_hi or not self.blocks:
            return _Lru((_block([chain]), *self.blocks), hi)
        return _Lru((_block([*_chains(self.blocks[0]), chain]), *self.blocks[1:]),
                    max(self.open_hi, hi))

    def evict(self, room: int) -> list[_Lru] | None:
        """Every state after evicting oldest first until the entries fit ``room``: blocks
        while they fit, then what some order of the next block's chains keeps (chains whole,
        then the newest part of one: a block of its own, older), nothing older. None past
        ``KEPT_BRANCHES``."""
        total = 0
        for i, block in enumerate(self.blocks):
            size = sum(n * sz for c, n in block for _, sz in c)
            if total + size <= room:
                total += size
                continue
            cuts = _cuts(_chains(block), room - total)
            if cuts is None:
                return None
            out = []
            for whole, part in cuts:
                tail = tuple(b for b in (whole, part) if b)
                out.append(_Lru(self.blocks[:i] + (tail or ((frozenset(),) if i == 0 else ())),
                                self.open_hi))
            return out
        return [self]

    def settle(self, last: dict[Hashable, int], first: int) -> _Lru:
        """Entries no event from ``first`` on looks up become dead (``DEAD``, by size);
        blocks older than every live entry go (evicted before any live one, they leave it as
        it was)."""
        out = list(self.blocks)
        for i, block in enumerate(out):
            if any(k is not DEAD and last.get(k, -1) < first for c, _ in block for k, _ in c):
                out[i] = _block([tuple((k if k is DEAD or last.get(k, -1) >= first else DEAD,
                                        sz) for k, sz in c) for c in _chains(block)])
        while out and not any(k is not DEAD for c, _ in out[-1] for k, _ in c):
            out.pop()
        return _Lru(tuple(out), self.open_hi if out else None)


def _cuts(block: list[Chain], room: int) -> list[tuple[Block, Block]] | None:
    """What an eviction leaves of a block that does not fit ``room``: in some order of its
    chains, the most recent chains while they fit (``whole``) and the newest part of the
    next one that fits beside them (``part``, older than ``whole``); None past the limit."""
    sizes = [sum(sz for _, sz in c) for c in block]
    out: dict[tuple[Block, Block], None] = {}
    tries = 0
    for ci, chain in enumerate(block):
        others = [j for j in range(len(block)) if j != ci]
        stack: list[tuple[int, tuple[int, ...], int]] = [(0, (), 0)]
        while stack:
            tries += 1
            if len(out) > KEPT_BRANCHES or tries > 20 * KEPT_BRANCHES:
                return None
            k, chosen, used = stack.pop()
            if k < len(others):
                stack.append((k + 1, chosen, used))
                j = others[k]
                if used + sizes[j] <= room:
                    stack.append((k + 1, (*chosen, j), used + sizes[j]))
                continue
            keep, fill = len(chain), used
            while keep and fill + chain[keep - 1][1] <= room:
                fill += chain[keep - 1][1]
                keep -= 1
            if keep:  # the chain does not fit whole: it is the one cut
                out[(_block([block[j] for j in chosen]), _block([chain[keep:]]))] = None
    return list(out)


Pinned = dict[Hashable, tuple[int, frozenset]]  # key -> (size, the requests pinning it)
TierState = tuple[frozenset, frozenset, _Lru, _Lru]  # pinned, held keys per request, front, back


class _BlockTiers:
    """vLLM's encoder cache (alone, or in front of Dynamo's connector) as ``FreeableCache`` and
    ``TieredCache`` run it, with ``_Lru`` blocks for the freeable list (a freeable entry goes
    when an allocation finds the pinned entries, the entries released after it and itself over
    the budget) and for the connector's LRU; the pinned entries and held keys exact. A lookup
    or release gives every state the orders within the blocks allow."""

    def __init__(self, cache: Any) -> None:
        from ..caches.model import TieredCache

        self.tiered = isinstance(cache, TieredCache)
        self.front_cap = cache.front.capacity if self.tiered else cache.capacity
        self.back_cap = cache.capacity if self.tiered else 0
        self.bpt = cache.bytes_per_token if self.tiered else 1

    def front(self, pinned: Pinned, held: tuple, free: _Lru, rid: Hashable, key: Hashable,
              size: int) -> list[tuple[Pinned, tuple, _Lru, bool]]:
        """The front's lookup of one item: each outcome (pinned, held, free, served)."""
        if key in pinned:
            sz, users = pinned[key]
            return [({**pinned, key: (sz, users | {rid})}, (*held, key), free, True)]
        found = free.find(key)
        if found is not None:
            return [({**pinned, key: (found[1], frozenset([rid]))}, (*held, key),
                     free.remove(found[0], key), True)]
        room = self.front_cap - size - sum(sz for sz, _ in pinned.values())
        if room < 0:  # no room even with every freeable entry gone: computed, not kept
            return [(pinned, held, free, False)]
        outs = free.evict(room)
        if outs is None:
            raise _TooMany
        return [({**pinned, key: (size, frozenset([rid]))}, (*held, key), f, False)
                for f in outs]

    def back_touch(self, back: _Lru, chain: Chain, key: Hashable, size: int
                   ) -> list[tuple[_Lru, Chain, int]]:
        """The connector's lookup of an item the front missed, ``chain`` the request's
        touches so far (not yet in ``back``): each outcome (state, chain, hit)."""
        if size > self.back_cap:  # never saved
            return [(back, chain, 0)]
        if any(k == key for k, _ in chain):
            return [(back, (*(e for e in chain if e[0] != key), (key, size)), 1)]
        found = back.find(key)
        if found is not None:
            return [(back.remove(found[0], key), (*chain, (key, size)), 1)]
        room = self.back_cap - size
        outs = (_Lru((_block([chain]), *back.blocks), back.open_hi) if chain else back).evict(room)
        if outs is None:
            raise _TooMany
        if not chain:
            return [(b, ((key, size),), 0) for b in outs]
        return [_split_chain(b, chain, key, size) for b in outs]

    def lookup(self, st: TierState, rid: Hashable, items: Sequence[tuple[Hashable, int]],
               window: tuple[int, int]) -> list[tuple[TierState, int]]:
        """Every outcome of a request's lookups: (state, hits)."""
        pinned0, held0 = dict(st[0]), dict(st[1])
        empty: Chain = ()
        outs = [(pinned0, held0.get(rid, ()), st[2], st[3], empty, 0)]
        for key, size in items:
            tokens = -(-size // self.bpt) if self.tiered else size
            nxt = []
            for pinned, held, free, back, chain, hits in outs:
                for p2, h2, f2, served in self.front(pinned, held, free, rid, key, tokens):
                    if not self.tiered or served:
                        nxt.append((p2, h2, f2, back, chain,
                                    hits + (served and not self.tiered)))
                        continue
                    nxt += [(p2, h2, f2, b2, c2, hits + got)
                            for b2, c2, got in self.back_touch(back, chain, key, size)]
            outs = nxt
        return [((frozenset(p.items()), frozenset({**held0, rid: h}.items()), f,
                  b.add(c, *window)), hits) for p, h, f, b, c, hits in outs]

    def release(self, st: TierState, rid: Hashable, window: tuple[int, int]) -> TierState:
        """The request's entries released (input order, a repeat at its last occurrence):
        one no other request pins joins the open block of the freeable list."""
        pinned, held = dict(st[0]), dict(st[1])
        chain: list[tuple[Hashable, int]] = []
        for key in reversed(list(dict.fromkeys(reversed(held.pop(rid, ()))))):
            entry = pinned.get(key)
            if entry is None or rid not in entry[1]:
                continue
            if entry[1] - {rid}:
                pinned[key] = (entry[0], entry[1] - {rid})
                continue
            del pinned[key]
            chain.append((key, entry[0]))
        return (frozenset(pinned.items()), frozenset(held.items()),
                st[2].add(tuple(chain), *window), st[3])


def _split_chain(back: _Lru, chain: Chain, key: Hashable, size: int
                 ) -> tuple[_Lru, Chain, int]:
    """After an eviction over the request's chain put in front (``evict``): the chain's kept
    part back out of ``back``, ``key`` appended (a miss)."""
    first = back.blocks[0] if back.blocks else frozenset()
    kept = next((c for c, _ in first if c and chain[-len(c):] == c), ())
    if first and kept and len(first) == 1:
        back = _Lru(back.blocks[1:], back.open_hi)
    return back, (*kept, (key, size)), 0


class _TooMany(Exception):
    """An eviction with more outcomes than the search takes."""


def block_search(ev: Sequence[Event], items: Sequence[Sequence[tuple[Hashable, int]]],
                 gain: np.ndarray, cache: Any, budget: int = SEARCH_BUDGET,
                 spent: list[int] | None = None, last: dict[Hashable, int] | None = None
                 ) -> list[tuple[int, int]] | None:
    """Bounds on the lowest and highest hits of vLLM's encoder cache (alone or before Dynamo's
    connector) over every order of ``ev`` (sorted by window low) consistent with the windows:
    the search over placed sets of ``exact_search`` with ``_BlockTiers`` states. Exact when
    each request looks up one item; with several, overlapping requests can widen the band a
    little (tests: a band of 0..1 where every order gives 0). None past ``budget`` units of
    work or an eviction of too many outcomes (the work done goes into ``spent``)."""
    model, half = _BlockTiers(cache), gain.shape[0]
    last = _last_lookup(ev, items) if last is None else last
    cols = _Gains(gain)
    start: TierState = (frozenset(), frozenset(), _Lru(), _Lru())
    layer: dict[tuple[int, frozenset[int]], dict[TierState, tuple[float, ...]]] = {
        (0, frozenset()): {start: (0.0,) * (2 * half)}}
    memo: dict[tuple[TierState, int, int], list[tuple[TierState, int]]] = {}
    work = 0
    try:
        for step in range(_count(ev)):
            nxt: dict[tuple[int, frozenset[int]], dict[TierState, tuple[float, ...]]] = {}
            for (first, extra), states in layer.items():
                for q in _ready(ev, first, extra):
                    placed = _placed_after(first, extra, q)
                    into = nxt.setdefault(placed, {})
                    for st, val in states.items():
                        outs = memo.get((st, q, placed[0]))
                        if outs is None:
                            outs = memo[(st, q, placed[0])] = _block_step(
                                model, st, ev[q], items, last, placed[0])
                            work += BLOCK_COST * len(outs)
                        work += MOVE_COST * len(outs)
                        for new, got in outs:
                            _merge(into, new, val, got, cols[ev[q][3]])
                if work > budget:
                    return None
            layer = nxt
            if hopeless(work, step, _count(ev), budget):
                return None
            if len(memo) > MEMO:
                memo.clear()
    except _TooMany:
        return None
    finally:
        _spend(spent, work)
    vals = [v for states in layer.values() for v in states.values()]
    return [(round(min(v[w] for v in vals)), round(max(v[half + w] for v in vals)))
            for w in range(half)]


def _block_step(model: _BlockTiers, st: TierState, event: Event,
                items: Sequence[Sequence[tuple[Hashable, int]]], last: dict[Hashable, int],
                first: int) -> list[tuple[TierState, int]]:
    lo, hi, kind, p = event
    outs = (model.lookup(st, p, items[p], (lo, hi)) if kind == 0
            else [(model.release(st, p, (lo, hi)), 0)])
    return [((a, b, f.settle(last, first), k.settle(last, first)), got)
            for (a, b, f, k), got in outs]


def _merge(into: dict, state: Hashable, val: tuple[float, ...], got: int,
           worth: tuple[float, ...]) -> None:
    half = len(worth)
    if got:
        val = tuple(v + got * g for v, g in zip(val, worth * 2))
    cur = into.get(state)
    into[state] = val if cur is None else (
        tuple(map(min, cur[:half], val[:half])) + tuple(map(max, cur[half:], val[half:])))


def _last_lookup(ev: Sequence[Event], items: Sequence[Sequence[tuple[Hashable, int]]]
                 ) -> dict[Hashable, int]:
    """Per key: the last lookup event that holds it."""
    return _last_of(((q, p) for q, (_, _, kind, p) in enumerate(ev) if kind == 0), items)


def _last_of(lookups: Iterable[tuple[int, int]],
             items: Sequence[Sequence[tuple[Hashable, int]]]) -> dict[Hashable, int]:
    """Per key: the last of ``lookups`` (event, request), in event order, whose request holds
    it (later events overwrite earlier ones)."""
    return {key: q for q, p in lookups for key, _ in items[p]}


# -- past the block search: a search over entry ages (a bound) --------------------------------------
AGE_INF = 1 << 62  # the highest age of an entry that may be gone
TIER_STATES = 8  # age states kept per placed set and pinned structure before they are joined
TIER_LAYER = 6_000  # age states of one layer before fewer are kept per placed set
AGE_COST = 5  # work units per outcome and entry of an age step
Ages = dict[Hashable, tuple[int, int, int]]  # key -> (size, lowest age, highest age)


def _shift(ages: Ages, key: Hashable, ival: tuple[int, int] | None, size: int, cap: int
           ) -> Ages:
    """Every other entry's age after an LRU touch of ``key`` (its age ``ival``; None: absent,
    older than all): an entry certainly more recent keeps its age, one certainly older (or
    ``key`` absent) gains ``size``, else only its highest does. Past ``cap`` an entry may be
    gone (highest ``AGE_INF``) or is (dropped)."""
    c, d = ival if ival is not None else (AGE_INF, AGE_INF)
    out: Ages = {}
    for k, (sz, a, b) in ages.items():
        if k == key:
            continue
        if d < a:  # key certainly more recent than k
            out[k] = (sz, a, b)
            continue
        if c >= AGE_INF or c > b:  # key certainly older: k gains it in every state
            a += size
        b = AGE_INF if b >= AGE_INF or b + size > cap else b + size
        if a <= cap:
            out[k] = (sz, a, b)
    return out


def _join_ages(x: Ages, y: Ages) -> Ages:
    """The union of two age maps (an entry missing from one may be gone)."""
    out: Ages = {}
    for k in x.keys() | y.keys():
        p, q = x.get(k), y.get(k)
        if p is None or q is None:
            sz, a, _ = p or q  # type: ignore[misc]
            out[k] = (sz, a, AGE_INF)
        else:
            out[k] = (p[0], min(p[1], q[1]), max(p[2], q[2]))
    return out


@dataclass
class _Tiers:
    """One state of vLLM's encoder cache (alone, or in front of Dynamo's connector) with
    ages instead of orders. The pinned entries (key -> size, users) and each request's held
    keys are exact. A freeable entry's age is its size plus every pinned entry's and every
    entry released after it: it is evicted by an allocation of ``s`` iff age + ``s`` exceeds the
    budget (oldest first), and an allocation fails iff ``s`` exceeds the budget less the pinned
    sizes. The connector's entry's age is its size plus the distinct entries touched since
    (LRU's stack distance). Ages are intervals: a state stands for every order whose ages lie
    in them."""

    pinned: dict[Hashable, tuple[int, frozenset]]
    held: dict[Hashable, tuple]
    free: Ages
    back: Ages

    def copy(self) -> _Tiers:
        return _Tiers(dict(self.pinned), dict(self.held), self.free, self.back)

    def pin(self, key: Hashable, size: int, rid: Hashable) -> None:
        old = self.pinned.get(key)
        self.pinned[key] = (size, frozenset([rid])) if old is None else (old[0], old[1] | {rid})
        self.held[rid] = (*self.held.get(rid, ()), key)

    def structure(self) -> Hashable:
        return frozenset(self.pinned.items()), frozenset(self.held.items())

    def ages(self) -> Hashable:
        return frozenset(self.free.items()), frozenset(self.back.items())


class _TierModel:
    """The transitions of ``_Tiers`` as ``FreeableCache`` / ``TieredCache`` make them."""

    def __init__(self, cache: Any) -> None:
        from ..caches.model import TieredCache

        self.tiered = isinstance(cache, TieredCache)
        self.front_cap = cache.front.capacity if self.tiered else cache.capacity
        self.back_cap = cache.capacity if self.tiered else 0
        self.bpt = cache.bytes_per_token if self.tiered else 1

    def front(self, st: _Tiers, rid: Hashable, key: Hashable, size: int
              ) -> list[tuple[_Tiers, bool]]:
        """The front's lookup of one item: each possible outcome (state, served)."""
        cap = self.front_cap
        if key in st.pinned:
            n = st.copy()
            n.pin(key, st.pinned[key][0], rid)
            return [(n, True)]
        out = []
        ival = st.free.get(key)
        if ival is not None and ival[1] <= cap:  # may be there: a hit, pinned again
            n = st.copy()
            n.free = _shift(st.free, key, (ival[1], min(ival[2], cap)), ival[0], cap)
            n.pin(key, ival[0], rid)
            out.append((n, True))
        if ival is None or ival[2] > cap:  # may be gone: allocated, or not when it cannot fit
            n = st.copy()
            free = {k: v for k, v in st.free.items() if k != key}
            if size <= cap - sum(sz for sz, _ in st.pinned.values()):
                free = _shift(free, key, None, size, cap)
                n.pin(key, size, rid)
            n.free = free
            out.append((n, False))
        return out

    def back_touch(self, st: _Tiers, key: Hashable, size: int) -> tuple[int, int]:
        """The connector's lookup of an item the front missed: (certain, possible) hit."""
        cap = self.back_cap
        if size > cap:  # never saved
            return 0, 0
        ival = st.back.get(key)
        got = (0, 0) if ival is None else (int(ival[2] <= cap), int(ival[1] <= cap))
        back = _shift(st.back, key, None if ival is None else ival[1:], size, cap)
        back[key] = (size, size, size)
        st.back = back
        return got

    def lookup(self, st: _Tiers, rid: Hashable, items: Sequence[tuple[Hashable, int]]
               ) -> list[tuple[_Tiers, int, int]]:
        """Every outcome of a request's lookups: (state, certain hits, possible hits)."""
        out = [(st, 0, 0)]
        for key, size in items:
            nxt = []
            for cur, lo, hi in out:
                tokens = -(-size // self.bpt) if self.tiered else size
                for n, served in self.front(cur, rid, key, tokens):
                    if not self.tiered:
                        nxt.append((n, lo + served, hi + served))
                    elif served:
                        nxt.append((n, lo, hi))
                    else:
                        must, may = self.back_touch(n, key, size)
                        nxt.append((n, lo + must, hi + may))
            out = nxt
        return out

    def release(self, st: _Tiers, rid: Hashable) -> _Tiers:
        """The request's entries released (input order, a repeat at its last occurrence):
        one no other request pins becomes the most recent freeable entry."""
        n = st.copy()
        held = n.held.pop(rid, ())
        total = sum(sz for sz, _ in n.pinned.values())
        free = dict(n.free)
        for key in reversed(list(dict.fromkeys(reversed(held)))):
            entry = n.pinned.get(key)
            if entry is None or rid not in entry[1]:
                continue
            if entry[1] - {rid}:
                n.pinned[key] = (entry[0], entry[1] - {rid})
                continue
            del n.pinned[key]
            total -= entry[0]
            free[key] = (entry[0], entry[0] + total, entry[0] + total)
        n.free = free
        return n


TierLayer = dict[tuple[int, frozenset[int]], dict[Hashable, dict[Hashable, Any]]]


def age_search(ev: Sequence[Event], items: Sequence[Sequence[tuple[Hashable, int]]],
                gain: np.ndarray, cache: Any, budget: int = SEARCH_BUDGET,
                keep: int = TIER_STATES, spent: list[int] | None = None,
                last: dict[Hashable, int] | None = None
                ) -> tuple[list[tuple[int, int]], bool] | None:
    """Lowest and highest hits of vLLM's encoder cache (alone or before Dynamo's connector)
    over every order of ``ev``: the search over placed sets of ``exact_search`` with
    ``_Tiers`` states (ages; dead entries dropped). Exact (True) while no two states of one
    placed set and pinned structure had to be joined (past ``TIER_STATES``, fewer when a layer
    holds over ``TIER_LAYER``); else a bound. None past ``budget`` units of work (the work
    done goes into ``spent``)."""
    model, half = _TierModel(cache), gain.shape[0]
    last = _last_lookup(ev, items) if last is None else last
    start = _Tiers({}, {}, {}, {})
    layer: TierLayer = {(0, frozenset()): {start.structure(): {start.ages(): (
        start, (0.0,) * (2 * half))}}}
    work, joined = 0, False
    try:
        for step in range(_count(ev)):
            nxt: TierLayer = {}
            for (first, extra), groups in layer.items():
                for q in _ready(ev, first, extra):
                    placed = _placed_after(first, extra, q)
                    slot = nxt.setdefault(placed, {})
                    for states in groups.values():
                        for st, val in states.values():
                            work += _tier_step(model, st, val, ev[q], items, gain, last,
                                               placed[0], slot)
                if work > budget:
                    return None
            joined |= _tier_trim(nxt, keep)
            layer = nxt
            if hopeless(work, step, _count(ev), budget):
                return None
    finally:
        _spend(spent, work)
    vals = [v for groups in layer.values() for states in groups.values()
            for _, v in states.values()]
    return [(round(min(v[w] for v in vals)), round(max(v[half + w] for v in vals)))
            for w in range(half)], not joined


def _tier_step(model: _TierModel, st: _Tiers, val: tuple[float, ...], event: Event,
               items: Sequence[Sequence[tuple[Hashable, int]]], gain: np.ndarray,
               last: dict[Hashable, int], first: int,
               slot: dict[Hashable, dict[Hashable, Any]]) -> int:
    """One event after state ``st`` (hits so far ``val``), each outcome merged into ``slot``
    with dead entries dropped; returns the work done."""
    _, _, kind, p = event
    half = gain.shape[0]
    outs = model.lookup(st, p, items[p]) if kind == 0 else [(model.release(st, p), 0, 0)]
    for n, lo, hi in outs:
        n.free = {k: v for k, v in n.free.items() if last.get(k, -1) >= first}
        n.back = {k: v for k, v in n.back.items() if last.get(k, -1) >= first}
        new = tuple(val[w] + lo * float(gain[w, p]) for w in range(half)) + tuple(
            val[half + w] + hi * float(gain[w, p]) for w in range(half))
        states = slot.setdefault(n.structure(), {})
        key = n.ages()
        cur = states.get(key)
        states[key] = (n, new) if cur is None else (cur[0], _widen(cur[1], new))
    return AGE_COST * len(outs) * (1 + len(st.free) + len(st.back))


def _widen(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    half = len(a) // 2
    return tuple(map(min, a[:half], b[:half])) + tuple(map(max, a[half:], b[half:]))


def _tier_trim(layer: TierLayer, cap: int) -> bool:
    """Join the states of a placed set and pinned structure past ``cap`` (fewer when the
    layer holds over ``TIER_LAYER``; all into one, in a deterministic order); True when any
    were joined."""
    total = sum(len(states) for groups in layer.values() for states in groups.values())
    keep = max(1, min(cap, TIER_LAYER * cap // max(total, 1)))
    joined = False
    for groups in layer.values():
        for struct, states in groups.items():
            if len(states) <= keep:
                continue
            joined = True
            merged: _Tiers | None = None
            val: tuple[float, ...] = ()
            for st, v in states.values():
                if merged is None:
                    merged, val = st.copy(), v
                    continue
                merged.free = _join_ages(merged.free, st.free)
                merged.back = _join_ages(merged.back, st.back)
                val = _widen(val, v)
            assert merged is not None
            groups[struct] = {merged.ages(): (merged, val)}
    return joined


# -- other targets past the search: the coarse bound ------------------------------------------------
def _events(s: np.ndarray, f: np.ndarray, fin: np.ndarray | None,
            fin_lo: np.ndarray | None = None) -> list[Event]:
    """Lookups (window ``[s, f]``) and the later moments after them (``[fin_lo, fin]``,
    ``fin_lo`` defaulting to ``s``), sorted by window low (then lookups first, then by
    position)."""
    return _tuples(_event_columns(s, f, fin, fin_lo))


EventColumns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # lo, hi, kind, position


def _tuples(cols: EventColumns, stop: int | None = None) -> list[Event]:
    return list(zip(*(c[:stop].tolist() for c in cols)))


def _event_columns(s: np.ndarray, f: np.ndarray, fin: np.ndarray | None,
                   fin_lo: np.ndarray | None = None, head: int | None = None) -> EventColumns:
    """``_events`` as columns (``head``: only the first so many, without sorting the rest)."""
    pos = np.arange(s.size, dtype=np.int64)
    lo, hi, kind = [np.asarray(s, np.int64)], [np.asarray(f, np.int64)], [np.zeros_like(pos)]
    if fin is not None:
        lo.append(np.asarray(s if fin_lo is None else np.maximum(fin_lo, s), np.int64))
        hi.append(np.maximum(np.asarray(fin, np.int64), hi[0]))
        kind.append(np.ones_like(pos))
    lo_a = np.concatenate(lo)
    keep: Any = slice(None)
    if head is not None and head < lo_a.size:  # those at or below the head's last low
        keep = np.flatnonzero(lo_a <= np.partition(lo_a, head - 1)[head - 1])
    # one column at a time (a million requests: 24 MB each)
    cols = [lo_a[keep], np.concatenate(hi)[keep], np.concatenate(kind)[keep],
            np.tile(pos, len(lo))[keep]]
    del lo_a, lo, hi, kind
    order = np.lexsort((cols[3], cols[2], cols[0]))[:head]
    for k in range(4):
        cols[k] = cols[k][order]
    return cols[0], cols[1], cols[2], cols[3]


PROBE_EVENTS = 4_096  # the head a search first runs over: most give up in their first steps
# ... from this many events on (a search that goes past the head there keeps a pace of at most
# 2 * budget / PROBE_FROM per step, so the head's work it repeats is at most 1/16 of its budget)
PROBE_FROM = 1 << 17


class _EventLists:
    """The band's events (``_events`` of the windows ``args``) and each key's last lookup among
    them (``_last_lookups``), made only as far as the searches need them: over ``PROBE_FROM``
    events, each search first runs over a head of ``PROBE_EVENTS``, which answers as the whole
    list would when it gives up there (a million requests: their tuples took 565 MB, their
    sorted columns 0.6 s and 100 MB)."""

    def __init__(self, args: tuple[np.ndarray, np.ndarray, np.ndarray | None,
                                   np.ndarray | None],
                 items: Sequence[Sequence[tuple[Hashable, int]]]) -> None:
        self.args, self.items = args, items
        self.total = int(args[0].size) * (1 if args[2] is None else 2)
        self.whole: tuple[list[Event], dict[Hashable, int]] | None = None
        self.head: tuple[_Head, dict[Hashable, int]] | None = None

    def run(self, search: Callable[[Sequence[Event], list[int], dict[Hashable, int]], Any],
            spent: list[int]) -> Any:
        """``search(events, spent, last)`` over the head, else over the whole list."""
        if self.whole is None and self.total > max(PROBE_EVENTS, PROBE_FROM):
            if self.head is None:
                cols = _event_columns(*self.args, head=PROBE_EVENTS)
                self.head = (_Head(_tuples(cols), self.total),
                             _last_lookups(cols, self.items, self.total))
            tried: list[int] = []
            try:
                found = search(*self.head[:1], tried, self.head[1])
            except _Truncated:
                pass
            else:
                spent.extend(tried)
                return found
        if self.whole is None:
            cols = _event_columns(*self.args)
            self.whole, self.head = (_tuples(cols), _last_lookups(cols, self.items)), None
        return search(self.whole[0], spent, self.whole[1])


def _last_lookups(cols: EventColumns, items: Sequence[Sequence[tuple[Hashable, int]]],
                  total: int | None = None) -> dict[Hashable, int]:
    """``_last_lookup`` of the events ``cols``, from the columns. ``total``: ``cols`` is the
    head of a list of ``total`` events, each request looked up once in it; a key a lookup past
    the head holds gets ``total`` (a search over the head compares it only with events of the
    head: as any place past them would)."""
    it = RequestItems.of(items)
    at = np.flatnonzero(cols[2] == 0)  # the lookups, in event order
    keys = it.key[it.refs(cols[3][at])]
    last = np.full(it.num_keys, -1, np.int64)
    last[keys] = np.repeat(at, it.counts[cols[3][at]])  # later events overwrite earlier ones
    if total is not None:
        last[np.bincount(it.key, minlength=last.size) > np.bincount(keys, minlength=last.size)
             ] = total
    held = np.flatnonzero(last >= 0)
    return {it.name(k): q for k, q in zip(held.tolist(), last[held].tolist())}


# -- first come, first served: the order a scheduler's first tokens show ------------------------
# First tokens closer than the tie window may come from one engine step: either order. The
# window is at least TIE_NS (one step's first tokens behind vLLM's server at low load; steps of
# a GPU engine come 10 ms apart). At concurrency 8 on two cores, one step's first tokens
# reached the client up to 24 ms apart behind Dynamo's frontend (its steps' 110 ms apart and
# more, prefills of 875 tokens), 6.3 ms behind vLLM's (26 ms and more), and a fixed 5 ms split
# such a step: the band missed the engine's count. So the window comes from the run
# (``tie_window``): where the sorted gaps between first tokens jump by TIE_JUMP or more (one
# step's spread below, the steps' spacing above), their geometric mean, unless that would put
# in one step a request sent after another's first token (then steps, not a spread, lie below
# the jump: an idle gap above them). A wider window only joins steps (a wider band, never a
# wrong one), so of several such jumps the highest wins: behind Dynamo's frontend one step's
# first tokens came 0.7 and 8.4 ms apart, steps 54 ms and more, and the steeper jump (1.2 to
# 8.4 ms) split that step: the engine looked up the last of the three first.
TIE_NS = 5_000_000
TIE_JUMP = 3.0
TIE_SPREAD_NS = 50_000_000  # the widest spread inside one step the jump may stand above
MAX_GROUP = 64  # a larger group of first tokens says no engine steps apart (a band over it: no)


@dataclass(frozen=True)
class FcfsWindows:
    """Windows on the first-token axis (module ``fcfs_windows``), by request; ``largest``:
    the size of the largest group."""

    lo: np.ndarray
    hi: np.ndarray
    later_lo: np.ndarray | None
    later_hi: np.ndarray | None
    largest: int = 0
    tie_ns: int = TIE_NS


def tie_window(first: np.ndarray, sent: np.ndarray | None = None) -> int:
    """The tie window of first tokens ``first`` (ns, any order; ``sent``: the requests' send
    times, same order): ``TIE_NS``, or where the sorted gaps between them jump by ``TIE_JUMP``
    or more, from a gap of at most ``TIE_SPREAD_NS`` to one above ``TIE_NS``, the two gaps'
    geometric mean (at most ``TIE_SPREAD_NS``): of such jumps the highest (the widest window)
    that puts no request sent after another's first token in one step with it. The widest, not
    the steepest: where the gaps jump twice (one step's spread of 1.2 ms, then 8.4 ms, then
    steps 54 ms apart), the lower jump would split a step, a band wrong for the engine's
    order, where the higher one at worst joins two steps, a wider band."""
    order = np.argsort(np.asarray(first, np.int64), kind="stable")
    f = np.asarray(first, np.int64)[order]
    s = None if sent is None else np.asarray(sent, np.int64)[order]
    gaps = np.diff(f)
    gaps = np.unique(np.maximum(gaps[gaps > 0], 1_000_000))  # below 1 ms: as 1 ms
    below, above = gaps[:-1], gaps[1:]
    jump = (above > TIE_NS) & (below <= TIE_SPREAD_NS) & (above >= TIE_JUMP * below)
    for k in np.flatnonzero(jump)[::-1].tolist():  # the widest window first
        tie = int(np.clip(np.sqrt(float(below[k]) * float(above[k])), TIE_NS, TIE_SPREAD_NS))
        if s is None or _one_step_possible(f, s, tie):
            return tie
    return TIE_NS


def _one_step_possible(f: np.ndarray, s: np.ndarray, tie: int) -> bool:
    """Whether every group of first tokens ``f`` (ascending) ``tie`` apart could be one engine
    step: each of its requests (sent at ``s``) sent before its earliest first token."""
    starts = np.flatnonzero(np.r_[True, np.diff(f) > tie])
    return bool(np.all(np.maximum.reduceat(s, starts) < f[starts]))


def fcfs_windows(s: np.ndarray, first: np.ndarray, reply_end: np.ndarray,
                 later: np.ndarray | None, slack: np.ndarray | None = None,
                 tie_ns: int | None = None) -> FcfsWindows:
    """The windows of a first-come-first-served engine, on the axis of first-token times.

    An engine that schedules in arrival order (vLLM's and SGLang's default, Dynamo's workers on
    vLLM) looks a request's items up in that order, and a request scheduled later never sees
    its first token earlier (its prefill only gets the tokens left after every earlier one's).
    So the first tokens the client saw give the order of the lookups, except for requests of
    one step, whose tokens come out together: first tokens closer than ``tie_ns`` (after each
    is widened by its clock ``slack``; default ``tie_window`` of them) form one group, within
    which any order is possible.
    A request's window is its group's span, so groups are ordered and members of one are not.

    A moment known only in real time, ``[a, b]`` (the lookup of a request without a first
    token, ``[s, reply_end]``; a later moment, ``[s, later]``), is placed on the same axis: after
    every group that ended before ``a`` (those lookups were done by their first tokens), and
    before every group after the group of the earliest request sent after ``b`` (it, and by the
    order of arrival every later group, looked up after ``b``). ``first``: -1 where a request
    has no first token.

    A later moment is placed this way too, never in its first token's group alone: vLLM frees
    an encoder-cache item at the end of the step its prefill passes it, and with a prefill
    chunked over several steps the requests scheduled in that step's leftover budget look up
    before it, though their first tokens come in later groups (measured on the Dynamo stack:
    ``tests/real_engine/test_dynamo_stack.py``)."""
    slack = np.zeros(s.size, np.int64) if slack is None else slack.astype(np.int64)
    tok = first >= 0
    tie_ns = tie_window(first[tok], (s - 2 * slack)[tok]) if tie_ns is None else tie_ns
    axis = _TokenAxis(s - slack, first, tok, slack, tie_ns)
    lo, hi = axis.spans()
    untok = np.flatnonzero(~tok)
    if untok.size:
        lo[untok], hi[untok] = axis.place((s - slack)[untok], (reply_end + slack)[untok])
    largest = int(np.bincount(axis.member).max()) if axis.member.size else 0
    if later is None:
        return FcfsWindows(lo, hi, None, None, largest, tie_ns)
    later_lo, later_hi = axis.place(s - slack, later + slack)
    return FcfsWindows(lo, hi, np.maximum(later_lo, lo), np.maximum(later_hi, hi), largest,
                       tie_ns)


class _TokenAxis:
    """The groups of first tokens (``fcfs_windows``) and the placing of real-time moments."""

    def __init__(self, sent: np.ndarray, first: np.ndarray, tok: np.ndarray, slack: np.ndarray,
                 tie_ns: int) -> None:
        self.n, self.tok = sent.size, tok
        t_lo, t_hi = (first - slack)[tok], (first + slack)[tok]
        # by first token: a group ends where the next token's low is over ``tie_ns`` past the
        # highest so far (the current group's end: every earlier group ended below its start)
        by_first = np.argsort(first[tok], kind="stable")
        lo_s, top = t_lo[by_first], np.maximum.accumulate(t_hi[by_first])
        opens = np.r_[True, lo_s[1:] - top[:-1] > tie_ns] if lo_s.size else np.zeros(0, bool)
        self.member = np.zeros(lo_s.size, np.int64)
        self.member[by_first] = np.cumsum(opens) - 1
        self.starts = lo_s[opens]  # each group's start and end on the axis, ascending
        self.ends = top[np.r_[np.flatnonzero(opens)[1:] - 1, lo_s.size - 1]] if lo_s.size \
            else np.zeros(0, np.int64)
        by_sent = np.argsort(sent[tok], kind="stable")
        self.sent_sorted = sent[tok][by_sent]
        # per position in send order: the lowest group among the requests sent from there on
        self.low_group_after = (np.minimum.accumulate(self.member[by_sent][::-1])[::-1]
                                if self.member.size else self.member)

    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """Each request's group span (zeros for requests without a first token)."""
        lo, hi = np.zeros(self.n, np.int64), np.zeros(self.n, np.int64)
        idx = np.flatnonzero(self.tok)
        lo[idx], hi[idx] = self.starts[self.member], self.ends[self.member]
        return lo, hi

    def place(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Windows on the axis of moments known to lie in real-time ``[a, b]``."""
        if not self.starts.size:  # no first token at all: any order
            return np.zeros(a.size, np.int64), np.zeros(a.size, np.int64)
        ends, last = self.ends, self.sent_sorted.size - 1
        before = np.searchsorted(ends, a, side="left") - 1  # last group ending before a
        w_lo = np.where(before >= 0, ends[np.maximum(before, 0)] + 1, self.starts[0] - 1)
        nxt = np.searchsorted(self.sent_sorted, b, side="right")  # first request sent after b
        w_hi = np.where(nxt <= last, ends[self.low_group_after[np.minimum(nxt, last)]],
                        ends[-1] + 1)
        return np.minimum(w_lo, w_hi), np.maximum(w_lo, w_hi)


# -- other targets past the search: the coarse bound ------------------------------------------------
def coarse_band(items: Sequence[Sequence[tuple[Hashable, int]]], unit: Sequence[int] | np.ndarray,
                s: np.ndarray, f: np.ndarray, weights: Sequence[np.ndarray]
                ) -> list[tuple[int, int]]:
    """Sound for any cache: no hit is certain, and an item whose key no other request may
    have brought earlier (nor an earlier item of its own request) is a certain miss. Each
    key's two earliest senders decide it for every request that holds the key."""
    cols = RequestItems.of(items)
    key_a, pos_a, num_keys = cols.key, cols.owner, cols.num_keys
    # an item's key first in its request: the earliest of its (request, key) run (the sort is
    # stable); every item, where no request holds two (items released one by one)
    first_a = np.ones(key_a.size, bool)
    if (cols.counts > 1).any():
        by = np.lexsort((key_a, pos_a))
        pk, kk = pos_a[by], key_a[by]
        first_a[by] = np.r_[True, (pk[1:] != pk[:-1]) | (kk[1:] != kk[:-1])][:key_a.size]
        del by, pk, kk
    may_hit = ~first_a  # a repeat within its request may hit
    hp, hk = pos_a[first_a], key_a[first_a]  # the holders: one per (key, request)
    if hp.size:
        sent = np.asarray(s)[hp]
        # by key, then send time and position (positions in send order: by key, stably)
        order = (np.argsort(hk, kind="stable") if (np.diff(sent) >= 0).all()
                 else np.lexsort((hp, sent, hk)))
        k_sorted, lead = hk[order], np.r_[True, hk[order][1:] != hk[order][:-1]]
        head = np.flatnonzero(lead)  # each key's earliest sender, then its second
        earliest_p = np.empty(num_keys, np.int64)
        earliest_p[k_sorted[head]] = hp[order][head]
        earliest_s = np.zeros(num_keys, sent.dtype)
        earliest_s[k_sorted[head]] = sent[order][head]
        has_second = np.zeros(num_keys, bool)
        second_s = np.zeros(num_keys, sent.dtype)
        nxt = head + 1
        two = (nxt < order.size) & ~np.r_[lead, True][nxt]
        has_second[k_sorted[head[two]]] = True
        second_s[k_sorted[head[two]]] = sent[order][nxt[two]]
        is_first = earliest_p[hk] == hp
        other_s = np.where(is_first, second_s[hk], earliest_s[hk])
        other = np.where(is_first, has_second[hk], True)  # another holder exists
        may_hit[first_a] = other & (other_s <= np.asarray(f)[hp])
    gain = np.bincount(pos_a[may_hit], minlength=len(cols)) * np.asarray(unit, np.float64)
    return [(0, round(float(np.asarray(w, np.float64) @ gain))) for w in weights]


# -- entry point --------------------------------------------------------------------------------
# the methods in the order they are tried (a target tries those that apply to it)
METHODS = ("known order", "exact search", "block search", "age bound", "stack bound",
           "coarse bound")


def _tier_band(events: _EventLists, items: Sequence[Sequence[tuple[Hashable, int]]],
               gain: np.ndarray, cache: Any, budget: int, known: bool,
               start: int = 0, spent: list[int] | None = None) -> Band | None:
    """vLLM's encoder cache (alone or before Dynamo's connector) past the exact search:
    the block search (a quarter of the budget), else the age search: half of it, or what the
    searches before it left of seven eighths (``spent``: their work; they give up early when
    their pace says they would not finish), whichever is more; those before
    ``METHODS[start]`` skipped."""
    spent = [] if spent is None else spent
    if start <= METHODS.index("block search"):
        blocks = events.run(lambda ev, sp, last: block_search(ev, items, gain, cache,
                                                              budget // 4, sp, last), spent)
        if blocks is not None:
            return Band(blocks, "block search", known)
    if start > METHODS.index("age bound"):
        return None
    left = max(budget // 2, budget * 7 // 8 - sum(spent))
    ages = events.run(lambda ev, sp, last: age_search(ev, items, gain, cache, left, spent=sp,
                                                      last=last), spent)
    return None if ages is None else Band(ages[0], "age bound", known)


def _tier_target(factory: Callable[[], Any]) -> bool:
    """vLLM's encoder cache, alone or before Dynamo's connector: the age search applies."""
    from ..caches.model import FreeableCache, TieredCache

    return type(factory()) in (FreeableCache, TieredCache)


def stack_target(target: Any) -> bool:
    """A single LRU whose entries are present from the lookup on: the stack method applies."""
    return target.front is None and target.eviction == "lru" and target.insert_on_lookup


def items_apart(items: Sequence[Sequence[tuple[Hashable, int]]]
                ) -> tuple[RequestItems, np.ndarray]:
    """Each item as a request of its own, and the position of its request (``owner``: index
    its request's windows, weights and failure with it): the band of a target whose entries
    are released item by item. vLLM's scheduler looks an item up when a prefill chunk first
    reaches it and frees it at the end of the step that passes it, so with a prefill chunked
    over several steps a request's first item can be freed (and evicted) before its second is
    looked up. As requests of their own, a request's items may take any order and any moments
    within its windows: a superset of the engine's orders (so the band still holds every one
    of them). A request without items stays one (empty) request."""
    return RequestItems.of(items).apart()


def _items_alone(items: Sequence[Sequence[tuple[Hashable, int]]], s: np.ndarray, f: np.ndarray,
                 fin: np.ndarray | None, fin_lo: np.ndarray | None,
                 weights: Sequence[np.ndarray], fail: Sequence[bool] | None) -> tuple[
        RequestItems, list[int], np.ndarray, np.ndarray, np.ndarray | None,
        np.ndarray | None, list[np.ndarray], list[bool]]:
    """``order_band``'s arguments with each item a request of its own (``items_apart``)."""
    split, own = items_apart(items)
    fails = np.zeros(len(items), bool) if fail is None else np.asarray(fail, bool)
    return (split, [1] * len(split), s[own], f[own], None if fin is None else fin[own],
            None if fin_lo is None else fin_lo[own], [np.asarray(w)[own] for w in weights],
            fails[own].tolist())


def order_band(target: Any, items: Sequence[Sequence[tuple[Hashable, int]]], images: list[int],
               capacity: int, s: np.ndarray, f: np.ndarray, fin: np.ndarray | None,
               weights: Sequence[np.ndarray], factory: Callable[[], Any],
               fail: Sequence[bool] | None = None, budget: int = SEARCH_BUDGET,
               fin_lo: np.ndarray | None = None, after: str | None = None) -> Band:
    """The band over every arrival order consistent with the windows ``[s, f]`` (send
    positions, ``s`` ascending), one (low, high) per weight vector (a weight per position).
    ``factory`` makes the target's empty cache; ``fin``: the latest times of a target's later
    moments (entries released or present), ``fail``: positions whose request failed before it
    (its entries are released, nothing becomes present); ``fin_lo``: the later moments' earliest
    times (default ``s``). ``after``: the method a band over fewer orders of the same requests
    took (the first-come-first-served band, for the band over any order): the searches that
    ran out of budget there are not tried, as more orders only make them larger."""
    known = known_order(s, f if fin is None or stack_target(target) else np.maximum(f, fin))
    items = RequestItems.of(items)  # (columns: a million requests' lists cost 0.8 GB)
    if target.releases:  # freed item by item: each item a request of its own
        items, images, s, f, fin, fin_lo, weights, fail = _items_alone(
            items, s, f, fin, fin_lo, weights, fail)
    set_entry = target.entry == "embedding-set"
    unit = (np.maximum(np.asarray(images, np.float64), 1.0) if set_entry
            else np.ones(len(items), np.float64))
    gain = np.array([np.asarray(w, np.float64) * unit for w in weights]).reshape(len(weights), -1)
    stack = stack_target(target)
    events = _EventLists((s, f, None if stack else fin, fin_lo), items)
    tiers = _tier_target(factory)
    start = METHODS.index(after) if after in METHODS else 0
    spent: list[int] = []
    found = None
    if known or start <= METHODS.index("exact search"):
        found = events.run(lambda ev, sp, last: exact_search(
            ev, items, gain, factory, fail or [False] * len(items),
            budget // 8 if tiers else budget, sp, last), spent)
    if found is not None:
        return Band(found, "known order" if known else "exact search", known)
    band = _tier_band(events, items, gain, factory(), budget, known, start,
                      spent) if tiers else None
    if band is None and stack and start <= METHODS.index("stack bound"):
        band = _stack_answer(target, items, unit, capacity, s, f, weights, factory)
    return band or Band(coarse_band(items, unit.astype(np.int64), s, f, weights),
                        "coarse bound", False)


def _stack_answer(target: Any, items: RequestItems, unit: np.ndarray,
                  capacity: int, s: np.ndarray, f: np.ndarray, weights: Sequence[np.ndarray],
                  factory: Callable[[], Any]) -> Band | None:
    """The stack bound, unless a request may fail mid-walk (vLLM's mirror fault: its later
    items never looked up)."""
    if getattr(factory(), "stale_fault", False) and any(
            sum(sz for sz in dict(it).values() if sz <= capacity) > capacity for it in items):
        return None
    ids = RequestItems(items.start, items.key, items.size)  # the keys as their dense ids
    seq = _Seq(list(ids),
               unit.astype(int).tolist(), s, f, int(capacity), target.touch_request_first,
               target.oversize == "flush")
    return Band(stack_band(seq, weights), "stack bound", False)
