"""From a trace, a model and cache semantics to predicted hit rates (the numbers ``analyze`` shows)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError
from ..vlm import VisionModel
from . import concurrency
from .lru import OVERSIZE, Curve, lru_curve
from .trace import Trace

GIB = 1 << 30
FRACTIONS = (0.9, 0.99, 1.0)
INSERT = ("schedule", "completion")
CURVE_SAMPLES = 400  # capacities simulated for a curve under insert-at-completion


@dataclass(frozen=True)
class Semantics:
    """How the cache behaves: keying is decided when the trace is built; the rest lives here."""

    oversize: str = "bypass"
    insert: str = "schedule"
    in_flight: int = 1
    dispatch: str = "file"
    real_width: bool = False

    def check(self) -> None:
        if self.oversize not in OVERSIZE:
            raise UserError(f"unknown oversize policy {self.oversize!r}")
        if self.insert not in INSERT:
            raise UserError(f"unknown insert policy {self.insert!r}; choose from {', '.join(INSERT)}")
        if self.dispatch not in concurrency.DISPATCH:
            raise UserError(f"unknown dispatch order {self.dispatch!r}")
        if self.in_flight < 1:
            raise UserError(f"--in-flight must be at least 1, got {self.in_flight}")


@dataclass
class Analysis:
    """Summary numbers (``summary``, JSON-ready) plus the byte curve for ``--curve``/``--plot``."""

    summary: dict
    curve: Curve
    curve_sampled: bool = False
    totals: dict = field(default_factory=dict)

    def curve_rows(self) -> dict[str, np.ndarray]:
        """The curve as columns with rates (every capacity where a count changes)."""
        t = self.totals
        c = self.curve
        return {"capacity_bytes": c.capacity, "capacity_gib": c.capacity / GIB, "hits": c.hits,
                "hit_rate": c.hits / max(t["references"], 1),
                "byte_hit_rate": c.hit_bytes / max(t["bytes"], 1),
                "full_request_rate": c.full_requests / max(t["requests_with_images"], 1),
                "tokens_saved": c.hit_tokens}


class _Sim:
    """Insert-at-completion: hits at any capacity by event replay (memoised)."""

    def __init__(self, ev: np.ndarray, trace: Trace, sizes: np.ndarray, tokens: np.ndarray,
                 oversize: str):
        self.ev, self.ids, self.sizes, self.oversize = ev, trace.ids, sizes, oversize
        self.row_start = np.searchsorted(trace.ref_row, np.arange(trace.num_rows + 1))
        self.ref_bytes, self.ref_tokens = sizes[trace.ids], tokens[trace.ids]
        self.starts = np.flatnonzero(np.r_[True, np.diff(trace.ref_row) != 0]) if trace.ids.size \
            else np.zeros(0, np.int64)
        self.memo: dict = {}

    def at(self, cap: float, unit_sizes: bool = False) -> dict:
        key = (cap, unit_sizes)
        if key not in self.memo:
            weights = np.ones_like(self.sizes) if unit_sizes else self.sizes
            flags = concurrency.completion_flags(self.ev, self.row_start, self.ids, weights, cap,
                                                 self.oversize)
            full = np.minimum.reduceat(flags, self.starts) if flags.size else flags
            self.memo[key] = {
                "hits": int(flags.sum()), "hit_bytes": int(self.ref_bytes[flags].sum()),
                "hit_tokens": int(self.ref_tokens[flags].sum()), "full_requests": int(full.sum())}
        return self.memo[key]

    def smallest(self, min_hits: float, hi: int, unit_sizes: bool) -> int | None:
        """Smallest integer capacity in [0, hi] with enough hits (hit counts rise with capacity)."""
        if self.at(hi, unit_sizes)["hits"] < min_hits:
            return None
        lo = 0
        while lo < hi:
            mid = (lo + hi) // 2
            if self.at(mid, unit_sizes)["hits"] >= min_hits:
                hi = mid
            else:
                lo = mid + 1
        return lo


def analyze(trace: Trace, model: VisionModel, sem: Semantics, cache_bytes: list[float] = (),
            cache_images: list[int] = (), unknown_size: tuple[int, int] | None = None,
            want_curve: bool = True) -> Analysis:
    """Predict hit rates of ``trace`` for the asked byte and entry capacities, and thresholds."""
    sem.check()
    sizes, tokens = trace.costs(model, sem.real_width, unknown_size)
    ev = None
    if sem.dispatch == "sessions" or sem.insert == "completion":
        ev = concurrency.events(trace.num_rows, sem.in_flight, trace.sessions, sem.dispatch)
        if sem.dispatch == "sessions":
            trace = trace.reordered(concurrency.dispatch_order(ev))
            ev = concurrency.events(trace.num_rows, sem.in_flight, trace.sessions, sem.dispatch)
    ids, n = trace.ids, int(trace.ids.size)
    used = np.flatnonzero(np.bincount(ids, minlength=sizes.size))
    rows_with_images = int(np.count_nonzero(np.diff(trace.ref_row))) + 1 if n else 0
    totals = {"references": n, "bytes": int(sizes[ids].sum()), "tokens": int(tokens[ids].sum()),
              "requests_with_images": rows_with_images}
    ones = np.ones_like(sizes)
    byte_curve = lru_curve(ids, sizes, tokens, trace.ref_row, sem.oversize)
    count_curve = lru_curve(ids, ones, tokens, trace.ref_row, "flush", obj_bytes=sizes)

    if sem.insert == "schedule":
        def at_bytes(cap):
            return {k: int(v[0]) for k, v in byte_curve.at([cap]).items()}

        def at_images(cap):
            return {k: int(v[0]) for k, v in count_curve.at([cap]).items()}
        best = {"hits": n - used.size, "hit_bytes": totals["bytes"] - int(sizes[used].sum()),
                "hit_tokens": totals["tokens"] - int(tokens[used].sum()),
                "full_requests": int(byte_curve.full_requests[-1]) if byte_curve.hits.size else 0}

        def smallest(min_hits, unit):
            return (count_curve if unit else byte_curve).smallest_capacity(min_hits)
        curve, sampled = byte_curve, False
    else:
        sim = _Sim(ev, trace, sizes, tokens, sem.oversize)
        big = int(sizes[used].sum()) + 1

        def at_bytes(cap):
            return sim.at(cap)

        def at_images(cap):
            return sim.at(cap, unit_sizes=True)
        best = sim.at(big)

        def smallest(min_hits, unit):
            return sim.smallest(min_hits, used.size if unit else big, unit)
        curve, sampled = (_sampled_curve(sim, byte_curve) if want_curve else byte_curve), True

    def row(cap_bytes, cap_images, counts) -> dict:
        return {"capacity_gib": None if cap_bytes is None else cap_bytes / GIB,
                "capacity_bytes": cap_bytes, "capacity_images": cap_images,
                **_rates(counts, totals)}

    caps = [row(int(c), None, at_bytes(int(c))) for c in cache_bytes]
    caps += [row(None, int(c), at_images(int(c))) for c in cache_images]
    thresholds = []
    for frac in FRACTIONS:
        need = math.ceil(frac * best["hits"] - 1e-9)
        b = smallest(need, False) if need > 0 else 0
        i = smallest(need, True) if need > 0 else 0
        thresholds.append({"fraction_of_best": frac, "hits": need, "capacity_bytes": b,
                           "capacity_gib": None if b is None else b / GIB, "capacity_images": i})
    summary = {
        "source": trace.source, "info": trace.info,
        "model": {"name": model.name, "bytes_per_token": model.bytes_per_token,
                  "real_width": sem.real_width},
        "semantics": {"key": trace.info.get("key_mode", "image id"), "oversize": sem.oversize,
                      "insert": sem.insert, "dispatch": sem.dispatch,
                      "in_flight": sem.in_flight if ev is not None else None},
        "requests": trace.num_rows, "requests_with_images": rows_with_images, "references": n,
        "distinct_images": int(used.size), "compulsory_misses": int(used.size),
        "unbounded_misses": n - best["hits"],
        "distinct_bytes": int(sizes[used].sum()),
        "entry_bytes": {"min": int(sizes[used].min()) if used.size else 0,
                        "max": int(sizes[used].max()) if used.size else 0,
                        "mean": float(sizes[used].mean()) if used.size else 0.0},
        "best": _rates(best, totals), "capacities": caps, "thresholds": thresholds,
    }
    return Analysis(summary, curve, sampled, totals)


def _rates(c: dict, totals: dict) -> dict:
    return {"hits": c["hits"], "hit_rate": c["hits"] / max(totals["references"], 1),
            "byte_hit_rate": c["hit_bytes"] / max(totals["bytes"], 1),
            "full_request_rate": c["full_requests"] / max(totals["requests_with_images"], 1),
            "tokens_saved": c["hit_tokens"]}


def _sampled_curve(sim: _Sim, ref: Curve) -> Curve:
    """Insert-at-completion curve at up to CURVE_SAMPLES capacities of the schedule-time curve."""
    caps = ref.capacity
    if caps.size > CURVE_SAMPLES:
        caps = caps[np.unique(np.linspace(0, caps.size - 1, CURVE_SAMPLES).astype(int))]
    pts = [sim.at(int(c)) for c in caps]
    col = {k: np.array([p[k] for p in pts], np.int64) for k in ("hits", "hit_bytes", "hit_tokens",
                                                               "full_requests")}
    return Curve(caps.astype(np.int64), col["hits"], col["hit_bytes"], col["hit_tokens"],
                 col["full_requests"])
