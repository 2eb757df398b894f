"""What a cache size buys, with the fit's uncertainty (``simulate --cache-size a,b,c``).

Each cache size is one virtual run with the profile (``virtual.sweep_cache``). A profile fitted
by ``mmdatagen calibrate`` carries its costs' standard errors and their correlation
(``calibration.parameters`` / ``calibration.correlation``); the interval of every metric comes
from re-simulating at sigma points: the covariance is split into its principal axes
(eigenvectors ``v_k``, variances ``l_k``), and each size is simulated again at the costs moved by
``+sqrt(l_k) v_k`` and ``-sqrt(l_k) v_k`` (a cost moved below 0 is held at 0). A metric's
standard deviation is ``sqrt(sum_k ((m+_k - m-_k) / 2)^2)`` (first order, correlations kept);
the interval is the centre run's value ± one of it (about 68 % if the costs' errors are normal
and the metric is close to linear in them over ±1 sigma). A profile without a calibration (the
shipped ones: fits to published numbers without error bars) has no interval.

The SLO (``--slo STAT:MS``, STAT one of :data:`SLO_STATS`) is met at a size when the interval's
upper end (the value, without an interval) is within it; the knee is the size where the TTFT
avg curve is furthest below the straight line from the smallest to the largest size (both axes
scaled to [0, 1]): past it, more cache buys less.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import SpecError
from .profile import Profile

#: the metrics a what-if row carries (``virtual.sweep_cache``'s keys) and their intervals
METRICS = ("hit_rate", "time_to_first_token", "ttft_p50", "ttft_p99", "request_throughput",
           "output_token_throughput", "inter_token_latency", "request_latency")
#: ``--slo`` statistics -> the row key they read
SLO_STATS = {"ttft_avg": "time_to_first_token", "ttft_p50": "ttft_p50", "ttft_p99": "ttft_p99"}
METHOD = ("±1 sigma: each size re-simulated at sigma points along the principal axes of the "
          "calibrated costs' covariance (calibration.parameters, calibration.correlation)")


def uncertainty(prof: Profile) -> tuple[list[str], np.ndarray] | None:
    """The calibrated costs with a standard error above 0 and their covariance, or None."""
    cal = prof.calibration or {}
    params: dict[str, Any] = cal.get("parameters") or {}
    order = list(params)
    names = [n for n in order if float((params[n] or {}).get("se") or 0.0) > 0.0
             and hasattr(prof, n)]
    if not names:
        return None
    se = np.array([float(params[n]["se"]) for n in names])
    corr = np.eye(len(names))
    given = cal.get("correlation")
    if given is not None:
        try:
            full = np.asarray(given, dtype=float).reshape(len(order), len(order))
        except ValueError:
            raise SpecError("profile", "calibration.correlation must be a square matrix over "
                                       "calibration.parameters") from None
        at = [order.index(n) for n in names]
        corr = full[np.ix_(at, at)]
    if not np.all(np.isfinite(corr)):
        raise SpecError("profile", "calibration.correlation must hold finite numbers")
    return names, corr * np.outer(se, se)


def sigma_points(prof: Profile) -> list[tuple[Profile, Profile]]:
    """Pairs of profiles (+, -) along each principal axis of the costs' covariance."""
    found = uncertainty(prof)
    if found is None:
        return []
    names, cov = found
    values, vectors = np.linalg.eigh((cov + cov.T) / 2.0)
    centre = np.array([float(getattr(prof, n)) for n in names])
    pairs = []
    for lam, vec in zip(values, vectors.T):
        if lam <= 0.0:
            continue
        step = math.sqrt(float(lam)) * vec
        pairs.append(tuple(_moved(prof, names, centre + sign * step) for sign in (1.0, -1.0)))
    return pairs  # type: ignore[return-value]  # pairs built from (+, -)


def _moved(prof: Profile, names: list[str], values: np.ndarray) -> Profile:
    changes: dict[str, Any] = {n: max(0.0, float(v)) for n, v in zip(names, values)}
    return replace(prof, **changes)


def interval_rows(rows: list[dict], pairs: list[tuple[list[dict], list[dict]]],
                  metrics: tuple[str, ...] = METRICS) -> list[dict]:
    """``rows`` with ``interval`` ({metric: [low, high]}) from the sigma-point runs' rows."""
    for i, row in enumerate(rows):
        band: dict[str, list[float]] = {}
        for m in metrics:
            if row.get(m) is None:
                continue
            diffs = [(hi[i][m] - lo[i][m]) / 2.0 for hi, lo in pairs
                     if hi[i].get(m) is not None and lo[i].get(m) is not None]
            sd = math.sqrt(sum(d * d for d in diffs))
            low, high = row[m] - sd, row[m] + sd
            if m == "hit_rate":
                low, high = max(0.0, low), min(100.0, high)
            band[m] = [low, high]
        row["interval"] = band
    return rows


def whatif(turns: list, prof: Profile, sizes: list[float], **kw: Any) -> list[dict]:
    """One row per cache size (``virtual.sweep_cache``), with intervals when ``prof`` carries
    a calibration's uncertainty."""
    from .virtual import sweep_cache

    rows = sweep_cache(turns, prof, sizes, **kw)
    pairs = [(sweep_cache(turns, hi, sizes, **kw), sweep_cache(turns, lo, sizes, **kw))
             for hi, lo in sigma_points(prof)]
    return interval_rows(rows, pairs) if pairs else rows


def parse_slo(text: str | None) -> tuple[str, float] | None:
    """``STAT:MS`` -> (row key, milliseconds); None when not given."""
    if text is None:
        return None
    stat, _, ms = text.partition(":")
    if stat not in SLO_STATS:
        raise SpecError("slo", f"must be STAT:MS with STAT one of {', '.join(SLO_STATS)} "
                               f"(got {text!r:.40})")
    try:
        value = float(ms)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SpecError("slo", f"needs a positive number of milliseconds after ':' (got "
                               f"{text!r:.40})")
    return SLO_STATS[stat], value


def upper(row: dict, metric: str) -> float | None:
    """The interval's upper end of ``metric``, else its value."""
    band = (row.get("interval") or {}).get(metric)
    return band[1] if band else row.get(metric)


def slo_met(rows: list[dict], slo: tuple[str, float] | None) -> float | None:
    """The smallest cache size whose ``slo`` metric (upper end) is within it, or None."""
    if slo is None:
        return None
    metric, limit = slo
    ok = [r["cache_gb"] for r in rows if (v := upper(r, metric)) is not None and v <= limit]
    return min(ok) if ok else None


def knee(rows: list[dict], metric: str = "time_to_first_token") -> float | None:
    """The cache size furthest below the chord of ``metric`` against size (both scaled to
    [0, 1]); None with fewer than three sizes or a flat curve."""
    pts = sorted((r["cache_gb"], r[metric]) for r in rows if r.get(metric) is not None)
    if len(pts) < 3:
        return None
    xs, ys = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
    if xs[-1] == xs[0] or ys.max() == ys.min():
        return None
    x = (xs - xs[0]) / (xs[-1] - xs[0])
    y = (ys - ys.min()) / (ys.max() - ys.min())
    chord = y[0] + (y[-1] - y[0]) * x
    gap = chord - y if y[-1] <= y[0] else y - chord  # a falling curve bends below its chord
    i = int(np.argmax(gap))
    return float(xs[i]) if gap[i] > 1e-9 and 0 < i < len(xs) - 1 else None


COLUMNS = (("hit_rate", "Hit rate %"), ("time_to_first_token", "TTFT avg ms"),
           ("ttft_p50", "TTFT p50 ms"), ("ttft_p99", "TTFT p99 ms"),
           ("request_throughput", "Req/s"), ("output_token_throughput", "Output TPS"),
           ("inter_token_latency", "ITL avg ms"), ("request_latency", "Latency avg ms"))


def whatif_table(rows: list[dict], unit: str, slo: tuple[str, float] | None = None) -> str:
    """The console table: each metric with its interval (``low-high``) when there is one."""
    cols: tuple[tuple[str, str], ...] = COLUMNS
    if rows and "encoder_hits" in rows[0]:  # two tiers: the front's hits (whole run) beside
        cols = (cols[0], ("encoder_hits", "Encoder-cache hits"), *cols[1:])
    head = [f"Cache {unit}", *(h for _, h in cols)]
    body = [[f"{r['cache_gb']:g}", *(_cell(r, k) for k, _ in cols)] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(("interval: " + METHOD) if rows and "interval" in rows[0] else
                 "no interval: the profile carries no calibration uncertainty (fit one with "
                 "mmdatagen calibrate)")
    k = knee(rows)
    if k is not None:
        lines.append(f"knee of the TTFT avg curve: {k:g} {unit}")
    if slo is not None:
        met = slo_met(rows, slo)
        stat = next(s for s, key in SLO_STATS.items() if key == slo[0])
        upper_end = " (upper end of the interval)" if rows and "interval" in rows[0] else ""
        lines.append(f"SLO {stat} <= {slo[1]:g} ms: " + (
            f"met from {met:g} {unit}{upper_end}" if met is not None
            else "not met at any size simulated"))
    return "\n".join(lines)


def _cell(row: dict, key: str) -> str:
    v = row.get(key)
    if v is None:
        return "-"
    if key == "encoder_hits":
        return f"{v:g}"
    band = (row.get("interval") or {}).get(key)
    return f"{v:,.2f}" + (f" [{band[0]:,.2f}-{band[1]:,.2f}]" if band else "")
