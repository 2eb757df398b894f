"""The report's plots as data: one :class:`Figure` per plot, drawn as inline SVG and as PNG.

Builders here only read exports (and the aggregates stored in them); renderers live in
``svg.py`` (HTML) and ``png.py`` (matplotlib). Nothing here depends on either.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..exportmodel import SweepPoint

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


SeriesKind = Literal["line", "step", "scatter", "bar"]
Runs = list[tuple[str, dict[str, Any]]]  # (label, export) per run


@dataclass
class Series:
    label: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    kind: SeriesKind = "line"
    color: str | None = None
    dashed: bool = False


@dataclass
class Figure:
    key: str  # file stem of the PNG and id of the SVG
    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    y_min: float | None = None
    y_max: float | None = None
    x_min: float | None = None
    categories: list[str] | None = None  # bar charts: x tick labels
    note: str = ""

    def colored(self) -> Figure:
        for i, s in enumerate(self.series):
            if s.color is None:
                s.color = PALETTE[i % len(PALETTE)]
        return self

    def empty(self) -> bool:
        return not any(any(y is not None for y in s.ys) for s in self.series)


def _dist(ex: dict[str, Any], tag: str) -> tuple[list[float], list[float]] | None:
    """CDF points: from the stored 201-level quantiles, else the export's percentile block."""
    d = ex.get("distributions") or {}
    q = d.get(tag)
    if q:
        return list(q), [lv / 100.0 for lv in d.get("levels_pct", [])]
    b = ex.get(tag) or {}
    pts = [(b.get("min"), 0.0)] + [(b.get(f"p{p}"), p / 100.0)
                                   for p in (1, 5, 10, 25, 50, 75, 90, 95, 99)] + [(b.get("max"), 1.0)]
    xs = [x for x, _ in pts if isinstance(x, (int, float))]
    if not xs:
        return None
    return xs, [y for x, y in pts if isinstance(x, (int, float))]


def cdf_figure(runs: Runs, tag: str, title: str, key: str) -> Figure:
    fig = Figure(key, title, f"{title} (ms)", "fraction of requests", y_min=0.0, y_max=1.0)
    for label, ex in runs:
        pts = _dist(ex, tag)
        if pts:
            fig.series.append(Series(label, pts[0], pts[1], "line"))
    return fig.colored()


def timeline_figures(label: str, ex: dict[str, Any], key: str) -> list[Figure]:
    """Requests in flight, throughput per second, hit rate over time (client and server)."""
    tl = ex.get("timeline") or {}
    srv = ex.get("server_metrics_timeseries") or {}
    prefix = f"{label}: " if label else ""
    figs: list[Figure] = []
    if tl.get("t_s"):
        figs += [_inflight_figure(prefix, tl, srv, key), _throughput_figure(prefix, tl, key)]
    f = _hitrate_figure(prefix, tl, srv, key)
    if not f.empty():
        figs.append(f)
    return figs


def _has_values(srv: dict[str, Any], name: str) -> bool:
    return any(v is not None for v in srv.get(name) or [])


def _inflight_figure(prefix: str, tl: dict[str, Any], srv: dict[str, Any], key: str) -> Figure:
    """Client requests in flight per bin; the server's running and waiting when scraped."""
    f = Figure(f"{key}_inflight", f"{prefix}requests in flight", "time (s)", "requests",
               y_min=0.0)
    f.series.append(Series("client: in flight (mean per bin)", tl["t_s"], tl["in_flight"],
                           "step"))
    if srv.get("available"):
        if _has_values(srv, "running"):
            f.series.append(Series("server: running", srv["t_s"], srv["running"], "line"))
        if _has_values(srv, "waiting"):
            f.series.append(Series("server: waiting (queue depth)", srv["t_s"], srv["waiting"],
                                   "line"))
    return f.colored()


def _throughput_figure(prefix: str, tl: dict[str, Any], key: str) -> Figure:
    t = tl["t_s"]
    f = Figure(f"{key}_throughput", f"{prefix}throughput per second", "time (s)",
               "per second", y_min=0.0)
    f.series.append(Series("output tokens/s", t, tl["output_tokens_per_s"], "step"))
    f.series.append(Series("completed requests/s x 100", t,
                           [x * 100 for x in tl["completed_per_s"]], "step", dashed=True))
    return f.colored()


def _hitrate_figure(prefix: str, tl: dict[str, Any], srv: dict[str, Any], key: str) -> Figure:
    """Measured (headers) and predicted hit rate per bin, and the server's /metrics series."""
    f = Figure(f"{key}_hitrate", f"{prefix}image cache hit rate over time", "time (s)",
               "hit rate (%)", y_min=0.0, y_max=100.0)
    t = tl.get("t_s") or []
    if t and tl.get("hits") is not None:
        refs = [h + m for h, m in zip(tl["hits"], tl["misses"])]
        rate = [100.0 * h / r if r else None for h, r in zip(tl["hits"], refs)]
        f.series.append(Series("measured (headers)", t, rate, "step"))
        if tl.get("predicted_hits") is not None:
            pr = [100.0 * p / r if r else None for p, r in zip(tl["predicted_hits"], refs)]
            f.series.append(Series("predicted (LRU replay)", t, pr, "step", dashed=True))
    if srv.get("available") and _has_values(srv, "hit_rate"):
        f.series.append(Series(f"server /metrics ({srv.get('cache_source')})", srv["t_s"],
                               [None if v is None else 100.0 * v for v in srv["hit_rate"]], "line"))
    return f.colored()


def cache_figure(runs: Runs, key: str = "cache_hits") -> Figure | None:
    """Predicted beside measured hit rate per run (bars)."""
    cats = [label for label, _ in runs]
    meas: list[float | None] = []
    pred: list[float | None] = []
    srv: list[float | None] = []
    for _, ex in runs:
        c = ex.get("image_cache") or {}
        meas.append(_pct((c.get("measured") or {}).get("hit_rate")))
        pred.append(_pct((c.get("predicted") or {}).get("hit_rate")))
        srv.append(_pct((c.get("server_metrics") or {}).get("hit_rate")))
    fig = Figure(key, "image cache hit rate: predicted beside measured", "run", "hit rate (%)",
                 y_min=0.0, y_max=100.0, categories=cats)
    xs = list(range(len(cats)))
    for label, ys in (("predicted", pred), ("measured (headers)", meas),
                      ("measured (server /metrics)", srv)):
        if any(y is not None for y in ys):
            fig.series.append(Series(label, xs, ys, "bar"))
    return None if fig.empty() else fig.colored()


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * float(x)


def summary_mean(point: SweepPoint, metric: str) -> float | None:
    """A sweep point's mean of ``metric`` over its repeats (None: no repeat had it)."""
    s = point["summary"].get(metric)
    return None if s is None else s["mean"]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated by another (higher throughput and lower latency), by throughput."""
    pts = sorted(p for p in points if p[0] is not None and p[1] is not None)
    front: list[tuple[float, float]] = []
    best = float("inf")
    for x, y in sorted(pts, key=lambda p: (-p[0], p[1])):
        if y < best:
            front.append((x, y))
            best = y
    return sorted(front)


def pareto_figure(points: list[SweepPoint], stat: str, key: str) -> Figure:
    """Throughput (x) against TTFT ``stat`` (y) per sweep point, with the Pareto front."""
    fig = Figure(key, f"output throughput vs TTFT {stat}", "output tokens/s (mean of repeats)",
                 f"TTFT {stat} (ms)", y_min=0.0, x_min=0.0)
    pts = [(x, y) for p in points
           if (x := summary_mean(p, "output_token_throughput")) is not None
           and (y := summary_mean(p, f"ttft_{stat}")) is not None]
    if pts:
        fig.series.append(Series("sweep points", [x for x, _ in pts], [y for _, y in pts],
                                 "scatter"))
        front = pareto_front(pts)
        fig.series.append(Series("Pareto front", [x for x, _ in front], [y for _, y in front],
                                 "line", dashed=True))
    fig.note = "; ".join(p["name"] for p in points)
    return fig.colored()


def cache_size_figure(points: list[SweepPoint], key: str = "sweep_hit_rate", unit: str = "GiB"
                      ) -> Figure | None:
    """Hit rate against cache size (in the cache target's ``unit``), measured beside predicted
    (only when cache size varies)."""
    sizes = {p["params"].get("cache_gb") for p in points}  # float (SweepGrid), when swept
    if len(sizes) < 2:
        return None
    groups: dict[str, list[SweepPoint]] = {}
    for p in points:
        rest = ", ".join(f"{k}={v}" for k, v in p["params"].items() if k != "cache_gb")
        groups.setdefault(rest, []).append(p)
    fig = Figure(key, "image cache hit rate vs cache size", f"cache ({unit})", "hit rate (%)",
                 y_min=0.0, y_max=100.0, x_min=0.0)
    for rest, pts in groups.items():
        pts = sorted(pts, key=lambda p: float(p["params"]["cache_gb"]))
        xs = [float(p["params"]["cache_gb"]) for p in pts]
        suffix = f" ({rest})" if rest and len(groups) > 1 else ""
        for metric, label, dashed in (("hit_rate", "measured", False),
                                      ("predicted_hit_rate", "predicted", True)):
            ys = [_pct(summary_mean(p, metric)) for p in pts]
            if any(y is not None for y in ys):
                fig.series.append(Series(label + suffix, xs, ys, "line", dashed=dashed))
    return None if fig.empty() else fig.colored()


def _band_series(label: str, xs: list[float], rows: list[dict], metric: str, color: str
                 ) -> list[Series]:
    """A metric's line, and its interval's two edges (dashed) when the rows carry one."""
    out = [Series(label, xs, [r.get(metric) for r in rows], color=color)]
    bands = [(r.get("interval") or {}).get(metric) for r in rows]
    if any(bands):
        for edge, name in ((0, "low"), (1, "high")):
            out.append(Series(f"{label} {name}", xs, [b[edge] if b else None for b in bands],
                              color=color, dashed=True))
    return out


def whatif_figures(doc: dict[str, Any]) -> list[Figure]:
    """The what-if's plots (``simulate --cache-size a,b,c``, its sweep.json ``doc``): TTFT
    against cache size with the knee and the SLO marked, hit rate and request throughput
    against cache size; each metric with its interval's edges (dashed) when the profile
    carries a calibration."""
    knee, met = doc.get("knee"), doc.get("slo_met")
    rows = sorted(doc["rows"], key=lambda r: r["cache_gb"])
    xs = [float(r["cache_gb"]) for r in rows]
    unit = doc.get("unit", "GiB")
    ttft = Figure("whatif_ttft", "TTFT vs cache size", f"cache ({unit})", "TTFT (ms)", y_min=0.0)
    for i, (metric, label) in enumerate((("ttft_p50", "p50"), ("ttft_p99", "p99"),
                                         ("time_to_first_token", "avg"))):
        ttft.series += _band_series(label, xs, rows, metric, PALETTE[i])
    notes = []
    if knee is not None:
        y = next(r["time_to_first_token"] for r in rows if r["cache_gb"] == knee)
        ttft.series.append(Series("knee", [knee], [y], "scatter", color="#000000"))
        notes.append(f"knee at {knee:g} {unit}")
    slo = doc.get("slo")
    if slo:
        ttft.series.append(Series(f"SLO {slo[1]:g} ms", [xs[0], xs[-1]], [slo[1], slo[1]],
                                  color="#7f7f7f", dashed=True))
        if met is not None:
            y = next(r[slo[0]] for r in rows if r["cache_gb"] == met)
            ttft.series.append(Series("SLO met from", [met], [y], "scatter", color="#9467bd"))
        notes.append(f"SLO met from {met:g} {unit}" if met is not None else "SLO not met")
    ttft.note = "; ".join(notes)
    hits = Figure("whatif_hit_rate", "hit rate vs cache size", f"cache ({unit})", "hit rate (%)",
                  series=_band_series("hit rate", xs, rows, "hit_rate", PALETTE[0]), y_min=0.0,
                  y_max=100.0)
    rps = Figure("whatif_throughput", "request throughput vs cache size", f"cache ({unit})",
                 "requests/s",
                 series=_band_series("req/s", xs, rows, "request_throughput", PALETTE[0]),
                 y_min=0.0)
    return [ttft, hits, rps]
