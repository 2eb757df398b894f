"""Cache policies without a one-pass curve, answered by exact replays at chosen capacities.

A FIFO (vLLM's shared-memory ring) has no inclusion property, and insert-at-completion depends
on the completion order: each capacity is a replay. The replays are compiled and batched: one
pass over the trace answers up to ``BATCH`` capacities (``kernels.fifo_batch_kernel``,
``kernels.completion_batch_kernel``), counting misses per object and capacity, from which every
count of a capacity row follows. :class:`Points` memoises the counts; its threshold search is
the binary search over a grid of capacities (hit counts taken to rise with capacity) run for
several hit targets at once: the path each search would take is predicted from the counts known
so far, every capacity on those paths is replayed in one pass, and the walk is repeated on the
true counts until no search meets a capacity it has not replayed (the answers are those of the
search one replay at a time).

Insert at completion with one request at a time (Dynamo's disaggregated encode cache as analyze
runs it) needs no replay per capacity where every entry fits (:class:`OneAtATime`): a request's
completion puts its hits, then its misses, on top of the recency order, and the cache holds the
longest top run that fits, so one pass (``kernels.bounds_kernel``) gives each reference the
capacities below which it misses and from which it hits; only its last request's other objects,
whose hits at that capacity place them above or below it, lie between, and those few references
are decided per capacity (``kernels.decide_kernel``). Hits need not rise with capacity for a
reference, so the counts come per capacity, many a pass for about the cost of one; such a
counter's searches start wide and replay the neighbours of each predicted answer.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from . import kernels as K
from .lru import Curve
from .media import COUNTS, MODALITIES, modal_counts, modal_key
from .trace import Trace

BATCH = 32  # capacities per compiled pass (state: objects x BATCH)
GRID_EXACT = 4096  # capacity ranges searched exactly; larger ones on a geometric grid
GRID_STEP = 0.01  # relative step of that grid (thresholds of replay methods within 1 %)
SMALL_DEPTH = 48  # capacities of at most this many entries: a small direct replay
NEAR = 4  # grid neighbours replayed beside a walk's predicted answer (cheap counters)
SPREAD = 24  # capacities a cheap counter's searches start from
SEED_DEPTH = 1  # the search tree's top levels replayed first (shared by every search)
_CAP = 1 << 62
BITPOS = np.zeros(67, np.int64)  # the position of a single set bit b: BITPOS[b % 67]
BITPOS[[pow(2, k, 67) for k in range(64)]] = np.arange(64)

# counts at capacities (entry unit, or entries), each counted in full or, where a hit target is
# given (not -1), only until the replay cannot reach it (None: fewer hits than that)
Counter = Callable[[np.ndarray, bool, np.ndarray], list]


class Points:
    """Counts (hits, hit bytes and tokens, all-hit requests, per modality) at any capacity in
    the entry unit, or in entries (``unit``), from ``counter``; memoised."""

    def __init__(self, counter: Counter, spread: int = 0,
                 cheap: Callable[[bool], int] = lambda unit: _CAP) -> None:
        self.counter = counter
        # a counter whose cost hardly grows with the capacities of a pass from ``cheap(unit)``
        # up: its searches start from ``spread`` capacities across that part of the grid and
        # replay each walk's grid neighbours there too
        self.spread, self.cheap = spread, cheap
        self.memo: dict[tuple[int, bool], dict] = {}
        self.below: dict[tuple[int, bool], float] = {}  # replays stopped: fewer hits than this

    def at(self, cap: float, unit: bool = False) -> dict:
        return self.many([cap], unit)[0]

    def many(self, caps: Sequence[float] | np.ndarray, unit: bool = False) -> list[dict]:
        """Counts at each of ``caps`` (new ones replayed together)."""
        keys = [int(min(c, _CAP)) for c in caps]
        self._replay({c: -1.0 for c in keys if (c, unit) not in self.memo}, unit)
        return [self.memo[(c, unit)] for c in keys]

    def _replay(self, todo: dict[int, float], unit: bool) -> None:
        """Replay ``todo`` (capacity -> the hit target it is asked about, -1: every count)."""
        if not todo:
            return
        caps = sorted(todo)
        got = self.counter(np.array(caps, np.int64), unit, np.array([todo[c] for c in caps]))
        for c, counts in zip(caps, got):
            if counts is None:
                self.below[(c, unit)] = min(self.below.get((c, unit), np.inf), todo[c])
            else:
                self.memo[(c, unit)] = counts

    def smallest(self, needs: Sequence[float], hi: int, unit: bool) -> list[int | None]:
        """Per hit target, the smallest capacity in [0, hi] with at least that many hits:
        exact for small ranges, else on a grid of 1 % steps (a binary search each)."""
        grid = _grid(hi)
        top = self.many(self.starts(hi, unit), unit)[0]["hits"]
        out: list[int | None] = [None if top < need else -1 for need in needs]
        while True:
            known = sorted((c, v["hits"]) for (c, u), v in self.memo.items() if u == unit)
            xs, ys = np.array(known, np.float64).T
            xs = np.log1p(xs)  # hits against the log of the capacity: closer to a line
            todo: dict[int, float] = {}
            for k, need in enumerate(needs):
                if out[k] is not None:
                    out[k], unknown = _walk(grid, need, unit, self, xs, ys)
                    if unknown and self.spread:
                        unknown += self._near(grid, out[k], unit)
                    for cap in unknown:
                        todo[cap] = min(todo.get(cap, np.inf), need)
            if not todo:
                return out
            self._replay(todo, unit)


    def starts(self, hi: int, unit: bool) -> list[int]:
        """What the searches up to ``hi`` replay first: ``hi``, the seeds, and (a cheap
        counter) ``spread`` capacities across the grid."""
        grid = _grid(hi)
        part = grid[grid >= self.cheap(unit)]
        wide = part[np.linspace(0, part.size - 1, self.spread * (part.size > 0)).astype(
            np.int64)].tolist()
        return [hi, *self.seeds(hi), *wide]

    def _near(self, grid: np.ndarray, cap: int | None, unit: bool) -> list[int]:
        """Grid capacities next to a walk's predicted answer, not replayed yet."""
        at = int(np.searchsorted(grid, cap if cap is not None else grid[-1]))
        return [int(c) for c in grid[max(at - NEAR, 0):at + NEAR + 1]
                if (int(c), unit) not in self.memo and c >= self.cheap(unit)]

    @staticmethod
    def seeds(hi: int) -> list[int]:
        """The capacities every search up to ``hi`` probes first (replayed before the walks)."""
        grid = _grid(hi)
        return [0, *(int(grid[i]) for i in _tree_top(grid.size, SEED_DEPTH))]


def _grid(hi: int) -> np.ndarray:
    """The capacities a threshold search tries: all up to GRID_EXACT, else 1 % steps."""
    if hi <= GRID_EXACT:
        return np.arange(hi + 1)
    return np.unique(np.r_[0, np.geomspace(1, hi, int(np.log(hi) / np.log(1 + GRID_STEP)) + 2)
                           .astype(np.int64), hi])


def _tree_top(n: int, depth: int) -> list[int]:
    """Grid indices a binary search over ``n`` points can probe in its first ``depth`` steps."""
    out, level = [], [(0, n - 1)]
    for _ in range(depth):
        nxt = []
        for lo, top in level:
            if lo < top:
                mid = (lo + top) // 2
                out.append(mid)
                nxt += [(lo, mid), (mid + 1, top)]
        level = nxt
    return out


def _walk(grid: np.ndarray, need: float, unit: bool, pts: Points, xs: np.ndarray,
          ys: np.ndarray) -> tuple[int, list[int]]:
    """One binary search over ``grid``, with counts not replayed yet interpolated from the
    known ones (``xs``: log1p of their capacities, ``ys``: their hits): its answer, and the
    capacities on its path it could not decide."""
    lo, top = 0, grid.size - 1
    unknown = []
    while lo < top:
        mid = (lo + top) // 2
        cap = int(grid[mid])
        got = pts.memo.get((cap, unit))
        if got is not None:
            hits = float(got["hits"])
        elif pts.below.get((cap, unit), np.inf) <= need:
            hits = -1.0  # the replay stopped below a smaller target
        else:
            unknown.append(cap)
            hits = float(np.interp(np.log1p(cap), xs, ys))
        if hits >= need:
            top = mid
        else:
            lo = mid + 1
    return int(grid[lo]), unknown


def flag_counter(trace: Trace, sizes: np.ndarray, tokens: np.ndarray,
                 flags_at: Callable[[int, bool], np.ndarray]) -> Counter:
    """A counter from a per-capacity hit-flag function (one replay per capacity)."""
    ref_bytes, ref_tokens = sizes[trace.ids], tokens[trace.ids]
    ref_mod = None if trace.modality is None else trace.modality[trace.ids]
    starts = np.flatnonzero(np.r_[True, trace.ref_row[1:] != trace.ref_row[:-1]]) \
        if trace.ids.size else np.zeros(0, np.int64)

    def counter(caps: np.ndarray, unit: bool, needs: np.ndarray) -> list:
        out = []
        for cap in caps.tolist():
            flags = flags_at(cap, unit)
            full = np.minimum.reduceat(flags, starts) if flags.size else flags
            counts = {"hits": int(flags.sum()), "hit_bytes": int(ref_bytes[flags].sum()),
                      "hit_tokens": int(ref_tokens[flags].sum()), "full_requests": int(full.sum())}
            if ref_mod is not None:
                counts.update(modal_counts(flags, ref_mod, ref_bytes, ref_tokens))
            out.append(counts)
        return out
    return counter


class _Misses:
    """What the batch kernels count (misses, their bytes and tokens, requests with a miss, and
    per modality) turned into the count dicts of hits."""

    def __init__(self, trace: Trace, sizes: np.ndarray, tokens: np.ndarray) -> None:
        ids = trace.ids
        self.m = int(sizes.size)
        mod = np.zeros(self.m, np.int64) if trace.modality is None else trace.modality
        self.info = K.lines(self.m, 4, 0)  # per object, in one cache line: bytes, tokens,
        self.info.reshape(-1, 4)[:, :3] = np.stack([sizes, tokens, mod], 1)  # modality
        self.width = 4 if trace.modality is None else 4 + 3 * len(MODALITIES)
        rows = int(np.count_nonzero(trace.ref_row[1:] != trace.ref_row[:-1])) + 1 \
            if ids.size else 0
        self.total = [int(ids.size), int(sizes[ids].sum()), int(tokens[ids].sum()), rows]
        if trace.modality is not None:
            refs = np.bincount(ids, minlength=self.m)
            for code in range(len(MODALITIES)):
                sel = mod == code
                self.total += [int(refs[sel].sum()), int((refs * sizes)[sel].sum()),
                               int((refs * tokens)[sel].sum())]

    def counts(self, out: np.ndarray) -> list[dict]:
        """``out``: the kernel's counts, one row per capacity."""
        hits = np.asarray(self.total, np.int64) - np.asarray(out, np.int64).reshape(
            -1, self.width)
        names = ["hits", "hit_bytes", "hit_tokens", "full_requests"]
        if self.width > 4:
            names += [modal_key(m, c) for m in MODALITIES for c in COUNTS]
        return [dict(zip(names, map(int, row))) for row in hits]


def _batched(misses: _Misses, w: np.ndarray, used: np.ndarray, caps: np.ndarray,
             needs: np.ndarray, run: Callable[[np.ndarray, np.ndarray], np.ndarray],
             batch: int = BATCH, split: bool = True) -> list:
    """Counts at ``caps``, ``BATCH`` capacities a ``run(capacities, stops)``: a capacity with a
    hit target stops once its misses leave fewer hits (None); a capacity below every entry's
    weight ``w`` keeps nothing (no replay: nothing hits). On a long trace, with ``split``, the
    passes run on ``kernels.threads`` threads, at least a pass each (capacities dealt in turn:
    the small ones, which miss most, spread over them)."""
    smallest = int(w[used].min()) if used.size else 1
    zero = misses.counts(np.asarray(misses.total, np.int64))[0]
    out: list = [zero] * caps.size
    live = np.flatnonzero(caps >= smallest)
    stops = np.where(needs >= 0, misses.total[0] - np.ceil(needs), -1).astype(np.int64)
    n = min(K.threads(misses.total[0]), live.size) if split else 1
    if n > 1:
        passes = -(-live.size // batch)
        passes = -(-passes // n) * n  # a multiple of the threads
        parts = [live[j::passes] for j in range(passes)]
    else:
        parts = [live[i:i + batch] for i in range(0, live.size, batch)]
    done = K.in_threads([partial(run, caps[p], stops[p]) for p in parts], n)
    for part, got in zip(parts, done):
        got = np.asarray(got, np.int64).reshape(-1, misses.width)
        for j, row, counts in zip(part, got, misses.counts(got)):
            out[j] = None if row[0] > stops[j] >= 0 else counts
    return out


def fifo_counter(trace: Trace, sizes: np.ndarray, tokens: np.ndarray) -> Counter:
    """Counts of a FIFO by size that skips larger entries, many capacities a pass."""
    misses = _Misses(trace, sizes, tokens)
    ids = np.ascontiguousarray(trace.ids, np.int64)
    rows = np.ascontiguousarray(trace.ref_row, np.int64)
    used = np.flatnonzero(np.bincount(ids, minlength=misses.m))

    def counter(caps: np.ndarray, unit: bool, needs: np.ndarray) -> list:
        w = np.ones_like(sizes) if unit else np.asarray(sizes, np.int64)
        smallest = int(w[used].min()) if used.size else 1

        def run(part: np.ndarray, stop: np.ndarray) -> np.ndarray:
            k = part.size  # each capacity's ring holds as many entries as fit, and one more
            ring_at = np.r_[0, np.cumsum(np.minimum(part // smallest, misses.m) + 2)]
            return _run(K.fifo_batch_kernel, [
                ids, rows, w, misses.info, part, stop, np.zeros(misses.m, np.int64),
                np.zeros(int(ring_at[-1]), np.int64), ring_at.astype(np.int64),
                np.zeros(k * misses.width, np.int64)], ids.size * k)
        return _batched(misses, w, used, caps, needs, run)
    return counter


def completion_counter(trace: Trace, sizes: np.ndarray, tokens: np.ndarray,
                       ev: np.ndarray | None, flush: bool) -> Counter:
    """Counts of an LRU that stores a missed entry when its request completes (``ev``: lookups
    ``r`` and completions ``~r``; None: one request at a time, in file order), many capacities
    a pass; one request at a time, from :class:`OneAtATime`."""
    misses = _Misses(trace, sizes, tokens)
    ids = np.ascontiguousarray(trace.ids, np.int64)
    row_start = np.ascontiguousarray(trace.row_start, np.int64)
    used = np.flatnonzero(np.bincount(ids, minlength=misses.m))
    rows = np.arange(trace.num_rows)  # each request completes before the next is looked up?
    one_at_a_time = ev is None or (ev.size == 2 * rows.size and bool(
        np.array_equal(ev[0::2], rows) and np.array_equal(ev[1::2], ~rows)))
    ev = np.zeros(0, np.int64) if ev is None else np.ascontiguousarray(ev, np.int64)
    one = OneAtATime(trace, row_start, misses, used, flush) if one_at_a_time else None

    def counter(caps: np.ndarray, unit: bool, needs: np.ndarray) -> list:
        w = np.ones_like(sizes) if unit else np.asarray(sizes, np.int64)

        def run(part: np.ndarray, stop: np.ndarray) -> np.ndarray:
            if one is not None:
                return one.run(w, unit, part, stop)
            k, m = part.size, misses.m
            return _run(K.completion_batch_kernel, [
                ev, row_start, ids, w, misses.info, part, stop, bool(flush),
                np.zeros(m, np.int64), np.zeros(m * k, np.int64), np.zeros(ids.size, np.int64),
                np.zeros(2 * ids.size, np.int64), np.zeros(k * misses.width, np.int64)],
                ids.size * k)
        if one is not None and not flush:  # counted in full anyway: keep every count
            needs = np.where(caps >= (int(w[used].max()) if used.size else 0), -1.0, needs)
        return _batched(misses, w, used, caps, needs, run, BATCH if one is None else 62,
                        split=one is None)  # one request at a time: its own threads
    if one is not None and not flush:  # from the largest entry up, a pass costs the same
        top = int(sizes[used].max()) if used.size else 0
        counter.cheap = lambda unit: 1 if unit else top  # type: ignore[attr-defined]
    return counter


class OneAtATime:
    """Insert at completion, one request at a time: counts at capacities that hold every entry
    from one precomputed pass (``kernels.bounds_kernel``: per reference, the capacities below
    which it misses and from which it hits, both in the entry unit and in entries; the few
    references between them decided per capacity by ``kernels.decide_kernel``), at
    capacities of a few entries by a small direct replay, else (or where the sizes are too
    large for the pass's packed tree, ``tree_unit``) by the general replay."""

    def __init__(self, trace: Trace, row_start: np.ndarray, misses: _Misses, used: np.ndarray,
                 flush: bool) -> None:
        self.misses, self.flush = misses, flush
        self.ids = np.ascontiguousarray(trace.ids, np.int64)
        self.ref_row = np.ascontiguousarray(trace.ref_row, np.int64)
        self.row_start = row_start
        self.used = used
        self.packs = tree_unit(np.ascontiguousarray(misses.info[0::4])) is not None
        self.longest = int(np.diff(self.row_start).max()) if trace.num_rows else 0
        self._bounds: tuple | None = None
        self._work: tuple | None = None
        self._log: tuple | None = None

    def run(self, w: np.ndarray, unit: bool, part: np.ndarray, stop: np.ndarray) -> np.ndarray:
        """Misses (``_Misses`` rows) at capacities ``part`` (ascending) with weights ``w``."""
        width = self.misses.width
        if self.flush:
            return self._replay(w, part, stop)
        out = np.zeros((part.size, width), np.int64)
        top = int(w[self.used].max()) if self.used.size else 0
        smallest = int(w[self.used].min()) if self.used.size else 1
        fits = (part >= top) & self.packs  # else (sizes too large to pack) the replay
        small = ~fits & (part // smallest + 2 <= SMALL_DEPTH)
        calls = [lambda: (fits, self._bounded(unit, part[fits])),
                 lambda: (small, self._small(part[small], smallest))]
        for sel, got in K.in_threads([c for c, sel in zip(calls, (fits, small)) if sel.any()],
                                     K.threads(self.ids.size)):  # the two side by side
            out[sel] = got.reshape(-1, width)
        rest = ~fits & ~small
        if rest.any():
            out[rest] = self._replay(w, part[rest], stop[rest]).reshape(-1, width)
        return out.reshape(-1)

    def _bounded(self, unit: bool, part: np.ndarray) -> np.ndarray:
        sizes = np.ascontiguousarray(self.misses.info[0::4])
        if self._bounds is None:
            self._bounds = bounds(self.ids, self.row_start, sizes)
        k, width, n = part.size, self.misses.width, self.ids.size
        order = np.argsort(part, kind="stable")  # the kernels take them ascending
        if self._work is None:  # hit bits and undecided references: one buffer each
            self._work = (np.empty(n, np.int64), np.empty(n, np.int64))
        nt = K.threads(n)  # the trace cut at requests into a part per thread
        rows = np.unique([0, *(int(self.ref_row[n * j // nt]) for j in range(1, nt)),
                          self.row_start.size - 1]).tolist()
        refs = self.row_start[rows].tolist()
        args = [self.row_start, self.ref_row, self.ids, sizes, self.misses.info, *self._bounds,
                part[order], *self._work, BITPOS]
        if K.for_size(K.hits_kernel, n) is K.hits_kernel:  # plain Python: on lists
            args = [a.tolist() for a in args]
        rs, rr, ids, sz, info, b, prev, nxt, caps, mask, amb, bitpos = args
        col = 2 * n if unit else 0
        hits = K.for_size(K.hits_kernel, n)
        ends = K.in_threads([partial(hits, b, col, caps, mask, amb, a, e)
                             for a, e in zip(refs, refs[1:])], nt)
        for a, e in zip(refs, ends):  # in trace order: a decision reads earlier ones
            K.for_size(K.decide_kernel, n)(rs, rr, ids, sz, b, col, prev, nxt, caps, mask, amb,
                                            a, int(e))
        count = K.for_size(K.miss_count_kernel, n)

        def misses(a: int, e: int) -> np.ndarray:  # requests a to e, into buffers of their own
            zeros = [np.zeros(size, np.int64) for size in ((k + 1) * width, k * width)]
            bufs = [z.tolist() for z in zeros] if isinstance(rs, list) else zeros
            return np.asarray(count(rs, ids, info, mask, bitpos, *bufs, a, e), np.int64)
        got = K.in_threads([partial(misses, a, e) for a, e in zip(rows, rows[1:])], nt)
        out = np.empty((k, width), np.int64)
        out[order] = np.sum(got, axis=0).reshape(k, width)
        return out

    def _small(self, part: np.ndarray, smallest: int) -> np.ndarray:
        at = np.r_[0, np.cumsum(part // smallest + 2)].astype(np.int64)
        width, m = self.misses.width, self.misses.m
        rec = K.lines(m, 4, 0)  # per object: presence bits, then its three info fields
        rec.reshape(m, 4)[:, 1:] = self.misses.info.reshape(m, 4)[:, :3]
        return _run(K.small_completion_kernel, [
            self.row_start, self.ids, rec, part, np.zeros(int(at[-1]), np.int64), at,
            np.zeros(self.longest, np.int64), np.zeros((part.size + 1) * width, np.int64)],
            self.ids.size * part.size)

    def _replay(self, w: np.ndarray, part: np.ndarray, stop: np.ndarray) -> np.ndarray:
        if self._log is None:
            self._log = completion_log(self.ids, self.row_start)
        k, m = part.size, self.misses.m
        return _run(K.completion1_batch_kernel, [
            self.row_start, self.ids, w, self.misses.info, part, stop, bool(self.flush),
            np.zeros(m, np.int64), np.zeros(m, np.int64), np.full(2 * m, -1, np.int64),
            np.zeros(self.longest, np.int64), *self._log, np.arange(2 * self.ids.size + 1),
            np.zeros(k * self.misses.width, np.int64)], self.ids.size * k)


def tree_unit(w: np.ndarray) -> tuple[int, int] | None:
    """How ``kernels.bounds_kernel`` packs a size and an object count into one number: the
    count's modulus (a power of two above the number of objects) and the sizes' common divisor;
    None where every size together would not fit (the general replay answers then)."""
    unit = 1 << int(w.size).bit_length()
    scale = int(np.gcd.reduce(w[w > 0])) if np.any(w > 0) else 1
    total = float(np.sum(w, dtype=np.float64)) / scale + 1  # (no int64 overflow here)
    return (unit, scale) if total * unit < 2.0 ** 61 else None


def bounds(ids: np.ndarray, row_start: np.ndarray, w: np.ndarray, parts: int | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``kernels.bounds_kernel`` over a trace (``w``: sizes ``tree_unit`` can pack): per
    reference its bounds (``w``'s unit, then entries), its object's previous and next
    reference. ``parts`` (compiled only): 2 passes the trace's halves, cut at a request, on
    two threads and joins them (``kernels.bounds_join_kernel``; the same answers); default: 2
    where ``kernels.threads`` gives two or more."""
    n, m = ids.size, int(w.size)
    nt = K.threads(n)
    cut = int(np.searchsorted(row_start, n // 2))  # the first request of the second half
    nxt = partial(_next, ids, m)
    packing = tree_unit(w)
    if packing is None:
        raise ValueError("sizes too large for bounds_kernel's packed tree")
    if (nt if parts is None else parts) < 2 or not 0 < cut < row_start.size - 1 or \
            K.for_size(K.bounds_kernel, n) is K.bounds_kernel:
        (b, prev, _, _), after = K.in_threads(
            [partial(_bounds_pass, ids, row_start, w, packing), nxt], nt)
        return b, prev, after
    at = int(row_start[cut])
    one, two, after = K.in_threads(
        [partial(_bounds_pass, ids[:at], row_start[:cut + 1], w, packing),
         partial(_bounds_pass, ids[at:], row_start[cut:] - at, w, packing), nxt], max(nt, 2))
    b = np.empty(4 * n, np.int64)  # each half's bounds in the unit, then in entries
    b[:2 * at], b[2 * n:2 * n + 2 * at] = one[0][:2 * at], one[0][2 * at:]
    b[2 * at:2 * n], b[2 * n + 2 * at:] = two[0][:2 * (n - at)], two[0][2 * (n - at):]
    prev = np.concatenate([one[1], np.where(two[1] >= 0, two[1] + at, -1)])
    K.compiled(K.bounds_join_kernel)(row_start, ids, b, prev, one[2], one[3], cut,
                                     np.zeros(m, np.int64), *packing)
    return b, prev, after


def _bounds_pass(ids: np.ndarray, row_start: np.ndarray, w: np.ndarray,
                 packing: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """``kernels.bounds_kernel`` over the requests of ``row_start`` (compacting as it needs):
    bounds, previous references, and its per-object state and Fenwick tree at the end."""
    n, m = ids.size, int(w.size)
    slots = 2 * m + 2 + (int(np.diff(row_start).max()) if n else 0)  # room for any request
    obj = K.lines(m, 8, -1)  # an object's record in one cache line
    obj[2::8], obj[5::8] = 0, w // packing[1]
    args: list[Any] = [row_start, ids, np.empty(4 * n, np.int64), np.empty(n, np.int64), obj,
                       np.zeros(slots + 1, np.int64), np.full(slots + 1, -1, np.int64),
                       np.array([0, 1, 0, 0], np.int64), *packing]
    fn, compact = K.for_size(K.bounds_kernel, n), K.for_size(K.compact_kernel, n)
    if fn is K.bounds_kernel:
        args = [a.tolist() if isinstance(a, np.ndarray) else a for a in args]
    while True:
        fn(*args)
        if args[7][0] >= row_start.size - 1:
            break
        compact(*args[4:9])
    return tuple(np.asarray(a, np.int64) for a in args[2:6])


def _next(ids: np.ndarray, m: int) -> np.ndarray:
    """Per reference, its object's next reference (-1: none)."""
    n = ids.size
    return np.asarray(K.for_size(K.next_kernel, n)(ids, np.empty(n, np.int64),
                                                   np.full(m, -1, np.int64)), np.int64)


def completion_log(ids: np.ndarray, row_start: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """One request at a time, each looked up then completed: the object of each access stamp
    (a request's lookups, then its completion, per reference), and the stamp from which a
    later access supersedes it at every capacity (the object's next lookup; for a completion
    also its next completion in the same request; past the end: never)
    (``kernels.completion_log_kernel``)."""
    n = ids.size
    m = int(ids.max()) + 1 if n else 0
    end = 2 * n + 1
    args = [row_start, ids, np.full(m, end, np.int64), np.full(m, end, np.int64),
            np.full(m, -1, np.int64), np.empty(2 * n, np.int64), np.empty(2 * n + 1, np.int64)]
    fn = K.for_size(K.completion_log_kernel, n)
    if fn is K.completion_log_kernel:
        lists = [a.tolist() for a in args]
        fn(*lists)
        return np.asarray(lists[5], np.int64), np.asarray(lists[6], np.int64)
    fn(*args)
    return args[5], args[6]


def _run(kernel, args: list, work: int) -> np.ndarray:
    """``kernel`` over ``args``, compiled for ``work`` steps and more; else plain Python on
    lists (faster than numpy scalars). Returns what it counted."""
    fn = K.for_size(kernel, work)
    if fn is not kernel:
        return fn(*args)
    return np.asarray(kernel(*[a.tolist() if isinstance(a, np.ndarray) else a for a in args]),
                      np.int64)


def sample_caps(sizes: np.ndarray, ids: np.ndarray, limit: int, refs: int, budget: int,
                min_samples: int) -> np.ndarray:
    """Where a sampled curve is replayed: up to ``limit`` capacities (fewer on long traces: the
    samples together replay at most ``budget`` references, but at least ``min_samples``),
    spaced geometrically from the smallest entry to all distinct entries together."""
    used = np.flatnonzero(np.bincount(ids, minlength=sizes.size))
    if used.size == 0:
        return np.zeros(1, np.int64)
    limit = int(min(limit, max(min_samples, budget // max(refs, 1))))
    lo, hi = int(sizes[used].min()), int(sizes[used].sum())
    return np.unique(np.geomspace(lo, max(hi, lo), limit).astype(np.int64))


def curve_from_points(pts: Points, caps: np.ndarray, modal: bool) -> Curve:
    """The curve of the counts at ``caps``."""
    got = pts.many(caps)
    names = ["hits", "hit_bytes", "hit_tokens", "full_requests"]
    if modal:
        names += [modal_key(m, c) for m in MODALITIES for c in COUNTS]
    return Curve.of([caps.astype(np.int64),
                     *(np.array([p[k] for p in got], np.int64) for k in names)])
