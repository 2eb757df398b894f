"""Repeat statistics: mean, spread and the Student-t 95 % confidence interval of the mean.

The t quantile is computed, not tabulated: the t CDF through the regularised incomplete beta
function (continued fraction, modified Lentz), inverted by bisection. No SciPy needed.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from ..exportmodel import Summary


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0.5 < p < 1)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError("need 0 < p < 1 and df > 0")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def summarize(values: Sequence[float | None], confidence: float = 0.95) -> Summary:
    """n, mean, sample std (n-1), min, max and the t confidence interval of the mean.

    None values (a metric a repeat did not have) are left out; with fewer than two values the
    interval and std are None.
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    out: Summary = {"n": n, "mean": None, "std": None, "min": None, "max": None,
                    "ci95_low": None, "ci95_high": None, "ci95_half": None}
    if n == 0:
        return out
    mean = sum(xs) / n
    out["mean"], out["min"], out["max"] = mean, min(xs), max(xs)
    if n >= 2:
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
        half = t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
        out["std"], out["ci95_half"] = std, half
        out["ci95_low"], out["ci95_high"] = mean - half, mean + half
    return out
