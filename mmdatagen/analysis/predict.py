"""From a trace, a model and cache semantics to predicted hit rates (the numbers ``analyze`` shows)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..caches import DEFAULT_TARGET, CacheTarget, get_target
from ..caches.targets import UNIT_SCALE
from ..errors import SpecError, UserError
from ..vlm import VisionModel
from . import concurrency, tiers
from . import kernels as K
from . import sampled as S
from . import targets as T
from .lru import OVERSIZE, Curve, curve_of, lru_curves, required_capacities
from .media import modal_key, modal_rows, modal_totals
from .trace import Trace

GIB = 1 << 30
FRACTIONS = (0.9, 0.99, 1.0)
INSERT = ("schedule", "completion")
CURVE_SAMPLES = 400  # capacities simulated for a curve under insert-at-completion
REPLAY_SAMPLES = 48  # capacities replayed for a FIFO's curve
REPLAY_CURVE_MAX_REFS = 50_000  # below a request's span, curves are replayed only this far
REPLAY_BUDGET = 100_000_000  # references replayed for one sampled curve, at most
MIN_SAMPLES = 16
SPREAD_ORDERS = 8  # completion orders (FIFO + seeded random) behind an a priori spread


@dataclass(frozen=True)
class Semantics:
    """How the cache behaves: its target (``mmdatagen.caches``) and the a priori concurrency
    model; ``oversize`` / ``insert`` override the target's own rules when given;
    ``encoder_budget``: a two-tier target's front (vLLM's encoder cache) in tokens, None for
    vLLM's rule (``caches.entries.front_budget``)."""

    oversize: str | None = None
    insert: str | None = None
    in_flight: int = 1
    dispatch: str = "file"
    real_width: bool = False
    target: str = DEFAULT_TARGET
    orders: int = SPREAD_ORDERS
    encoder_budget: int | None = None

    def check(self) -> None:
        """Each value against its field (``SpecError``: the CLI names the flag)."""
        if self.oversize is not None and self.oversize not in OVERSIZE:
            raise SpecError("oversize", f"{self.oversize!r} is unknown; choose from "
                            f"{', '.join(OVERSIZE)}")
        if self.insert is not None and self.insert not in INSERT:
            raise SpecError("register", f"{self.insert!r} is unknown; choose from "
                            f"{', '.join(INSERT)}")
        if self.dispatch not in concurrency.DISPATCH:
            raise SpecError("dispatch", f"{self.dispatch!r} is unknown; choose from "
                            f"{', '.join(concurrency.DISPATCH)}")
        if self.in_flight < 1:
            raise SpecError("in_flight", f"must be at least 1, got {self.in_flight}")
        t = self.cache()
        if t.front is None and self.encoder_budget is not None:
            raise SpecError("encoder_budget", "sizes the front tier of a two-tier cache "
                            f"(dynamo-embedding, dynamo-connector); `cache` {t.name} has none")
        if t.front is not None and (t.oversize != "bypass" or not t.insert_on_lookup):
            raise SpecError("cache", f"{t.name} saves at lookup and skips oversize entries "
                            "behind vLLM's encoder cache: its `register` and `oversize` rules "
                            "are fixed")
        if self.encoder_budget is not None and self.encoder_budget < 1:
            raise SpecError("encoder_budget", f"must be at least 1 token, got "
                            f"{self.encoder_budget}")

    def cache(self) -> CacheTarget:
        """The target with this analysis' overrides applied."""
        t = get_target(self.target)
        changes: dict = {}
        if self.oversize is not None:
            changes["oversize"] = self.oversize
        if self.insert is not None and t.eviction != "freeable":
            changes["present"] = t.lookup if self.insert == "schedule" else "completion"
        return replace(t, **changes) if changes else t

    @property
    def insert_mode(self) -> str:
        t = self.cache()
        return "schedule" if t.insert_on_lookup or t.eviction == "freeable" else "completion"


@dataclass
class Analysis:
    """Summary numbers (``summary``, JSON-ready) plus the byte curve for ``--curve``/``--plot``."""

    summary: dict
    curve: Curve
    curve_sampled: bool = False
    totals: dict = field(default_factory=dict)

    def curve_rows(self) -> dict[str, np.ndarray]:
        """The curve as columns with rates (every capacity where a count changes), and per
        modality its hits, hit rate, bytes hit and tokens saved on mixed datasets. A two-tier
        target's rates are of its connector's lookups; its misses and the front's hits beside."""
        t = self.totals
        c = self.curve
        rows = {"capacity_bytes": c.capacity, "capacity_gib": c.capacity / GIB, "hits": c.hits,
                "hit_rate": c.hits / max(t["references"], 1),
                "byte_hit_rate": c.hit_bytes / max(t["bytes"], 1),
                "full_request_rate": c.full_requests / max(t["requests_with_images"], 1),
                "tokens_saved": c.hit_tokens}
        front = self.summary.get("front")
        if front:  # a two-tier target: the connector's lookups and what the front served
            rows["misses"] = t["references"] - c.hits
            rows["encoder_hits"] = np.full(c.hits.size, front["hits"], np.int64)
        modal = self.summary.get("modalities", {})
        cols = c.columns()
        for m in modal if c.modal is not None else ():
            rows[f"{m}_hits"] = cols[modal_key(m, "hits")]
            rows[f"{m}_hit_rate"] = cols[modal_key(m, "hits")] / max(modal[m]["references"], 1)
            rows[f"{m}_bytes_hit"] = cols[modal_key(m, "hit_bytes")]
            rows[f"{m}_tokens_saved"] = cols[modal_key(m, "hit_tokens")]
        return rows


def _completion_points(ev, trace, sizes, tokens, oversize) -> S.Points:
    counter = S.completion_counter(trace, sizes, tokens, ev, oversize == "flush")
    cheap = getattr(counter, "cheap", None)
    return S.Points(counter) if cheap is None else S.Points(counter, S.SPREAD, cheap)


def _replay_points(target, trace, sizes, tokens, fifo: bool) -> S.Points:
    if fifo:
        return S.Points(S.fifo_counter(trace, sizes, tokens))
    replays: dict = {}

    def flags(cap, unit):
        w = np.ones_like(sizes) if unit else sizes
        if unit not in replays:
            replays[unit] = T.Replay(target, trace, w)
        return replays[unit].flags(cap)
    return S.Points(S.flag_counter(trace, sizes, tokens, flags))


def _curve_from_points(pts: S.Points, caps: np.ndarray, trace: Trace) -> Curve:
    return S.curve_from_points(pts, caps, trace.modality is not None)


def _sample_caps(trace: Trace, sizes: np.ndarray, limit: int) -> np.ndarray:
    """A sampled curve's capacities: ``limit`` at most, together replaying at most
    REPLAY_BUDGET references (but ``MIN_SAMPLES``)."""
    return S.sample_caps(sizes, trace.ids, limit, int(trace.ids.size), REPLAY_BUDGET,
                         MIN_SAMPLES)


@dataclass
class _Eval:
    """How one analysis answers: counts at a capacity (entry unit or images), the smallest
    capacity (entry unit or images) for each of several hit counts, the curve, and whether it
    was sampled."""

    at_size: Callable[[float], dict]
    at_images: Callable[[float], dict]
    smallest: Callable[[Sequence[float], bool], list[int | None]]
    curve: Curve
    sampled: bool
    method: str


def _stack_eval(curve: Curve, count_curve: Curve | None, method: str) -> _Eval:
    def at(c, cv=curve):
        return {k: int(v[0]) for k, v in cv.at([c]).items()}

    def at_images(c):
        if count_curve is None:
            raise UserError("a capacity in images is not defined for this cache target")
        return at(c, count_curve)

    def smallest(needs, unit):
        if unit and count_curve is None:
            return [None] * len(needs)
        cv = count_curve if unit and count_curve is not None else curve
        return [cv.smallest_capacity(n) for n in needs]
    return _Eval(at, at_images, smallest, curve, False, method)


def _sampled_eval(pts: S.Points, hi: Callable[[bool], int], samples: Callable[[], np.ndarray],
                  trace: Trace, warm: Sequence[int], want_curve: bool, method: str) -> _Eval:
    """A policy answered by replays (``pts``); thresholds searched up to ``hi(unit)``. The
    curve's ``samples`` (when wanted) and the capacities about to be asked (``warm``) are
    replayed together."""
    caps = samples() if want_curve else np.zeros(0, np.int64)
    pts.many([*caps.tolist(), *warm, *pts.starts(hi(False), False)])
    curve = (_curve_from_points(pts, caps, trace) if want_curve
             else Curve(*(np.zeros(0, np.int64),) * 5))
    return _Eval(pts.at, lambda c: pts.at(c, True), lambda h, u: pts.smallest(h, hi(u), u),
                 curve, True, method)


def _evaluate(t: CacheTarget, trace: Trace, sizes, tokens, ev, sem: Semantics,
              want_curve: bool, warm: Sequence[int] = ()) -> _Eval:
    """The fastest exact method for the target's policy over ``trace`` (dispatch order);
    ``warm``: capacities about to be asked (replayed at once where each is a replay)."""
    mod = trace.modality

    def curves(oversize) -> tuple[Curve, Curve]:
        return lru_curves(trace.ids, sizes, tokens, trace.ref_row, oversize, mod)

    def sampled(limit: int) -> Callable[[], np.ndarray]:
        return lambda: _sample_caps(trace, sizes, limit)
    if t.entry == "embedding-set":
        return _stack_eval(T.set_curve(trace, sizes, tokens), None,
                           "one-pass stack curve over image sets (exact)")
    if t.front is not None:  # ``trace``: the connector's lookups (``tiers.connector_trace``)
        return _stack_eval(*curves("bypass"), "vLLM's encoder cache replayed once; a one-pass "
                           "stack curve of Dynamo's connector over its misses (exact)")
    if t.eviction == "fifo":
        pts = _replay_points(t, trace, sizes, tokens, fifo=True)
        return _sampled_eval(
            pts, lambda u: sizes.size if u else int(sizes.sum()) + 1,
            sampled(REPLAY_SAMPLES), trace, warm, want_curve,
            "compiled FIFO replays, many capacities a pass (exact; FIFO hits need not rise "
            "with capacity)")
    if sem.insert_mode == "completion":
        pts = _completion_points(ev, trace, sizes, tokens, t.oversize)
        used = np.flatnonzero(np.bincount(trace.ids, minlength=sizes.size))
        return _sampled_eval(
            pts, lambda u: used.size if u else int(sizes[used].sum()) + 1 if used.size else 1,
            sampled(CURVE_SAMPLES), trace, warm, want_curve,
            "one request at a time: per reference, bounds on the capacity its hit needs from "
            "one recency pass, decided exactly at each capacity (compiled, many capacities a "
            "pass; small capacities replayed)" if pts.spread else
            f"event replay, {sem.in_flight} in flight completing first-in first-out "
            "(compiled, many capacities a pass)")
    if t.touch_request_first or t.eviction == "freeable":
        return _span_eval(t, trace, sizes, tokens, want_curve)
    return _stack_eval(*curves(t.oversize), "one-pass stack curve (exact)")


def _span_eval(t: CacheTarget, trace: Trace, sizes, tokens, want_curve: bool) -> _Eval:
    """Policies that keep a request's items together (vLLM's processor cache touches them
    first; its encoder cache pins them): a stack curve exact for every capacity that holds a
    request's distinct items together (the span), exact replays of the model below it."""
    span = T.request_span(trace, sizes)
    req, count = required_capacities(trace.ids, sizes[trace.ids], sizes.size)
    how = ("stack distance at each request's start" if t.touch_request_first
           else "one-pass stack curve by release order")

    def byte_curve() -> Curve:
        need = T.touch_required(trace, sizes, req) if t.touch_request_first else req
        return Curve.of(T._step_curve(need, trace.ids, sizes, tokens, trace.ref_row, span,
                                      obj_mod=trace.modality))
    curve, count_curve = K.in_threads(  # the two curves side by side
        [byte_curve, lambda: curve_of(count, trace.ids, sizes, tokens, trace.ref_row,
                                      trace.modality)], K.threads(trace.ids.size))
    pts = _replay_points(t, trace, sizes, tokens, fifo=False)

    def at(c):
        return pts.at(c) if c < span else {k: int(v[0]) for k, v in curve.at([c]).items()}

    def smallest(needs, unit):
        if unit:
            return [count_curve.smallest_capacity(n) for n in needs]
        hits = [curve.smallest_capacity(n) for n in needs]
        low = [n for n, h in zip(needs, hits) if h is None or h <= span]
        below = dict(zip(low, pts.smallest(low, span, False))) if low else {}
        return [h if h is not None and h > span else below[n] for n, h in zip(needs, hits)]
    if want_curve and span > 0 and trace.ids.size <= REPLAY_CURVE_MAX_REFS:
        low = _curve_from_points(pts, np.linspace(0, span - 1, 16).astype(np.int64), trace)
        curve = Curve.of([np.concatenate([low.capacity, curve.capacity]),
                          *(np.concatenate([low.columns()[k], col])
                            for k, col in curve.columns().items())])
    return _Eval(at, lambda c: {k: int(v[0]) for k, v in count_curve.at([c]).items()},
                 smallest, curve, span > 0,
                 f"{how} (exact from {span:,} up; exact replays of the cache model below)")


def _depends(sem: Semantics, t: CacheTarget) -> bool:
    """Whether hits depend on more than the dispatch order: completion order matters (insert
    at completion, or the front tier releasing items as requests complete), or sessions
    set the dispatch order itself."""
    return (sem.dispatch == "sessions" or sem.insert_mode == "completion"
            or (t.front is not None and sem.in_flight > 1))


def _concurrency_model(sem: Semantics, t: CacheTarget, depends: bool) -> str:
    if t.front is not None and sem.in_flight == 1:
        return ("one request in flight: vLLM's encoder cache releases each request's items "
                "before the next is scheduled (one order)")
    if depends and sem.in_flight == 1:
        return "one request in flight: each completes before the next starts (one order)"
    if not depends:
        return ("none needed: entries are present from their lookup, so only the dispatch "
                "order counts" + (" (file order)" if sem.dispatch == "file" else ""))
    return (f"{sem.in_flight} {'sessions' if sem.dispatch == 'sessions' else 'requests'} in "
            "flight; completions first-in first-out for the headline, the spread over "
            f"{sem.orders} orders (first-in first-out and {sem.orders - 1} seeded random)")


def analyze(trace: Trace, model: VisionModel, sem: Semantics,
            cache_bytes: Sequence[float] = (), cache_images: Sequence[int] = (),
            unknown_size: tuple[int, int] | None = None, want_curve: bool = True) -> Analysis:
    """Predict hit rates of ``trace`` for the asked capacities (``cache_bytes``: in the
    target's entry unit, bytes or tokens; ``cache_images``: entries) and thresholds."""
    sem.check()
    t = sem.cache()
    sizes, tokens = trace.costs(model, sem.real_width, unknown_size, target=t)
    base = trace
    depends = _depends(sem, t)
    front = _front(t, model, sem)
    trace, ev, front_row = _lookups(trace, sizes, tokens, sem, depends, front)
    used = np.flatnonzero(np.bincount(trace.ids, minlength=sizes.size))
    totals = _totals(trace, sizes, tokens)
    ev_ = _evaluate(t, trace, sizes, tokens, ev, sem, want_curve,
                    [int(sizes[used].sum()) * 2 + 1, *map(int, cache_bytes)])
    if front_row:
        ev_ = _whole_requests(ev_, front_row["requests_served"])
        totals["requests_with_images"] += front_row["requests_served"]
    best = ev_.at_size(int(sizes[used].sum()) * 2 + 1)
    modal = None if trace.modality is None else modal_totals(trace.ids, trace.modality, sizes,
                                                             tokens)
    caps = [_capacity_row(t, int(c), None, ev_.at_size(int(c)), totals, modal)
            for c in cache_bytes]
    caps += [_capacity_row(t, None, int(c), ev_.at_images(int(c)), totals, modal)
             for c in cache_images]
    _connector_rows(caps, front_row, trace, sizes)
    if depends and sem.orders > 1 and sem.in_flight > 1 and cache_bytes:
        spread = _spread(base, sizes, tokens, t, sem, [int(c) for c in cache_bytes], front)
        for r, s_ in zip(caps, spread):
            r["spread"] = s_
    summary = {
        "source": trace.source, "info": trace.info,
        "model": {"name": model.name, "bytes_per_token": model.bytes_per_token,
                  "real_width": sem.real_width, "geometry": model.geometry()},
        "cache": t.describe(),
        "semantics": {"key": trace.info.get("key_mode", "image id"), "oversize": t.oversize,
                      "insert": sem.insert_mode, "dispatch": sem.dispatch,
                      "in_flight": sem.in_flight if depends else None,
                      "method": ev_.method,
                      "concurrency_model": _concurrency_model(sem, t, depends)},
        "requests": trace.num_rows, "requests_with_images": totals["requests_with_images"],
        "references": totals["references"], "distinct_images": int(used.size),
        "compulsory_misses": int(used.size),
        "unbounded_misses": totals["references"] - best["hits"],
        "distinct_bytes": int(sizes[used].sum()),
        "entry_bytes": {"min": int(sizes[used].min()) if used.size else 0,
                        "max": int(sizes[used].max()) if used.size else 0,
                        "mean": float(sizes[used].mean()) if used.size else 0.0},
        "best": _rates(best, totals), "capacities": caps,
        "thresholds": _thresholds(t, ev_, best["hits"]),
    }
    if modal is not None:
        summary["modalities"] = {m: {**v, "best": modal_rows(best, {m: v})[m]}
                                 for m, v in modal.items()}
    if front_row:
        summary["front"] = front_row
    return Analysis(summary, ev_.curve, ev_.sampled, totals)


def _lookups(trace: Trace, sizes: np.ndarray, tokens: np.ndarray, sem: Semantics,
             depends: bool, front: tiers.Front | None
             ) -> tuple[Trace, np.ndarray | None, dict]:
    """What the target's cache is asked, in dispatch order: the trace (behind a ``front``
    tier, only the front's misses), its events where the order needs them, and the summary's
    ``front`` block (empty without a front)."""
    ev = None
    if depends and (sem.in_flight > 1 or sem.dispatch != "file"):  # else: None, one at a time
        trace, ev = _dispatched(trace, sem, None)
    if front is None:
        return trace, ev, {}
    back, row = _connector(trace, sizes, tokens, front, ev)
    return back, ev, row


def _front(t: CacheTarget, model: VisionModel, sem: Semantics) -> tiers.Front | None:
    """A two-tier target's front: its budget (given, or vLLM's rule) and the model's bytes per
    token; None for a single-tier target."""
    if t.front is None:
        return None
    from ..caches.entries import front_budget

    budget = front_budget(t, model, sem.encoder_budget)
    assert budget is not None
    return tiers.Front(int(budget), int(model.bytes_per_token))


def _connector(trace: Trace, sizes: np.ndarray, tokens: np.ndarray, front: tiers.Front,
               ev: np.ndarray | None) -> tuple[Trace, dict]:
    """The front replayed over ``trace`` (dispatch order; ``ev``: its events, None for one
    request at a time): the connector's lookups, and the summary's ``front`` block."""
    served, c = tiers.front_flags(trace, front.tokens(sizes), front.budget, ev)
    refs = int(trace.ids.size)
    back = tiers.connector_trace(trace, served)
    rows, asking = (_rows_with_refs(tr) for tr in (trace, back))
    return back, {
        "target": "vllm-encoder", "budget_tokens": front.budget, "references": refs,
        "hits": c["hits"], "hit_rate": c["hits"] / max(refs, 1),
        "tokens_saved": int(tokens[trace.ids[served]].sum()), "evictions": c["evictions"],
        "lookups_behind": refs - c["hits"], "requests_served": int(rows - asking)}


def _whole_requests(ev_: _Eval, served: int) -> _Eval:
    """A two-tier target's "all-hit" requests: those every item of which one of the tiers
    served (no encoder run), i.e. the connector's all-hit requests plus ``served`` requests
    the front served alone (never looked up behind it)."""
    def plus(counts: dict) -> dict:
        return {**counts, "full_requests": counts["full_requests"] + served}

    c = ev_.curve
    start = int(c.capacity.size == 0 or c.capacity[0] > 0)  # the new curve starts at 0
    cols = [np.r_[[0] * start, col].astype(np.int64) for col in (c.capacity, *c.columns().values())]
    cols[4] = cols[4] + served
    c = Curve.of(cols)
    return _Eval(lambda x: plus(ev_.at_size(x)), lambda x: plus(ev_.at_images(x)),
                 ev_.smallest, c, ev_.sampled, ev_.method)


def _connector_rows(caps: list[dict], front_row: dict, back: Trace, sizes: np.ndarray) -> None:
    """A two-tier target's capacity rows get the connector's counters (none without a front)."""
    if front_row and caps:
        evictions = tiers.Evictions(back, sizes.size)
        for row in caps:
            _connector_counts(row, evictions, back, sizes, front_row["hits"])


def _connector_counts(row: dict, evictions: tiers.Evictions, back: Trace, sizes: np.ndarray,
                      front_hits: int) -> None:
    """A two-tier capacity row's connector counters: its lookups, misses (each an encoder
    run), evictions, and the front's hits beside them."""
    lookups = int(back.ids.size)
    misses = lookups - row["hits"]
    if row["capacity_bytes"] is not None:
        ev = evictions.at(sizes, row["capacity_bytes"], row["hits"])
    else:
        ev = evictions.at(np.ones_like(sizes), row["capacity_images"], row["hits"])
    row.update(lookups=lookups, misses=misses, evictions=ev, encoder_runs=misses,
               encoder_hits=front_hits)


def _rows_with_refs(trace: Trace) -> int:
    """Requests with at least one reference (``ref_row`` is non-decreasing)."""
    n = int(trace.ids.size)
    return int(np.count_nonzero(trace.ref_row[1:] != trace.ref_row[:-1])) + 1 if n else 0


def _totals(trace: Trace, sizes: np.ndarray, tokens: np.ndarray) -> dict:
    refs = np.bincount(trace.ids, minlength=sizes.size)  # references per object
    return {"references": int(trace.ids.size), "bytes": int(refs @ sizes),
            "tokens": int(refs @ tokens), "requests_with_images": _rows_with_refs(trace)}


def _capacity_row(t: CacheTarget, cap: int | None, cap_images: int | None, counts: dict,
                  totals: dict, modal: dict | None = None) -> dict:
    row = {"capacity": None if cap is None else cap / UNIT_SCALE[t.unit], "unit": t.unit,
           "capacity_gib": None if cap is None or t.unit == "tokens" else cap / GIB,
           "capacity_bytes": cap, "capacity_images": cap_images, **_rates(counts, totals)}
    if modal is not None:
        row["by_modality"] = modal_rows(counts, modal)
    return row


def _thresholds(t: CacheTarget, ev_: _Eval, best_hits: int) -> list[dict]:
    """The smallest capacity (entry unit, and in images) reaching each share of the best."""
    out = []
    needs = [math.ceil(frac * best_hits - 1e-9) for frac in FRACTIONS]
    asked = [n for n in needs if n > 0]
    in_bytes = dict(zip(asked, ev_.smallest(asked, False))) if asked else {}
    images = t.entry != "embedding-set"
    in_images = dict(zip(asked, ev_.smallest(asked, True))) if asked and images else {}
    for frac, need in zip(FRACTIONS, needs):
        b = in_bytes[need] if need > 0 else 0
        i = in_images[need] if need > 0 and images else None
        out.append({"fraction_of_best": frac, "hits": need, "capacity_bytes": b,
                    "capacity": None if b is None else b / UNIT_SCALE[t.unit],
                    "capacity_gib": None if b is None or t.unit == "tokens" else b / GIB,
                    "capacity_images": 0 if need <= 0 else i})
    return out


def _dispatched(trace: Trace, sem: Semantics, seed: int | None) -> tuple[Trace, np.ndarray]:
    """The trace in dispatch order and its events (rows renumbered to that order)."""
    ev = concurrency.events(trace.num_rows, sem.in_flight, trace.sessions, sem.dispatch, seed)
    if sem.dispatch != "sessions":
        return trace, ev
    order = concurrency.dispatch_order(ev)
    pos = np.empty_like(order)
    pos[order] = np.arange(order.size)
    return trace.reordered(order), np.where(ev >= 0, pos[np.maximum(ev, 0)], ~pos[~np.minimum(ev, -1)])


def _spread(trace: Trace, sizes, tokens, t: CacheTarget, sem: Semantics,
            caps: list[int], front: tiers.Front | None = None) -> list[dict]:
    """Hit rates at ``caps`` over completion orders: first-in first-out plus seeded random
    choices of which in-flight request completes next (of the connector's lookups in that
    order, behind a ``front`` tier)."""
    per_cap: list[list[float]] = [[] for _ in caps]
    refs = max(int(trace.ids.size), 1)
    for seed in range(sem.orders):
        tr, ev = _dispatched(trace, sem, seed or None)
        if front is not None:
            tr = _connector(tr, sizes, tokens, front, ev)[0]
            refs = max(int(tr.ids.size), 1)
        e = _evaluate(t, tr, sizes, tokens, ev, sem, False, caps)
        for k, c in enumerate(caps):
            per_cap[k].append(e.at_size(c)["hits"] / refs)
    return [{"orders": len(v), "min": min(v), "median": float(np.median(v)), "max": max(v)}
            for v in per_cap]


def _rates(c: dict, totals: dict) -> dict:
    return {"hits": c["hits"], "hit_rate": c["hits"] / max(totals["references"], 1),
            "byte_hit_rate": c["hit_bytes"] / max(totals["bytes"], 1),
            "full_request_rate": c["full_requests"] / max(totals["requests_with_images"], 1),
            "tokens_saved": c["hit_tokens"]}
