"""Draw a :class:`~mmdatagen.report.figures.Figure` as an inline SVG string (no libraries).

Axes with round-number ticks, line / step / scatter / grouped-bar series, a legend, and a
``<title>`` tooltip on points and bars. Gaps (None values) break lines.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

from .figures import Figure, Series

W, H = 680, 330
ML, MR, MT, MB = 64, 16, 34, 76  # margins: left, right, top, bottom (legend below the axis)
Scale = Callable[[float], float]  # data coordinate -> pixel


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 10))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(v, 10))
    return ticks


def fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 10000:
        return f"{v / 1000:g}k"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _extent(fig: Figure) -> tuple[float, float, float, float]:
    """Data ranges (x0, x1, y0, y1) of the plotted points, widened by the figure's bounds."""
    x0, x1 = _x_extent(fig)
    y0, y1 = _y_extent(fig)
    if x1 <= x0:
        x1 = x0 + 1.0
    if y1 <= y0:
        y1 = y0 + 1.0
    return x0, x1, y0, y1


def _x_extent(fig: Figure) -> tuple[float, float]:
    """Category slots, else the x of every drawn point (a step series' last bin included)."""
    if fig.categories is not None:
        return -0.5, len(fig.categories) - 0.5
    xs = [x for s in fig.series for x, y in zip(s.xs, s.ys) if y is not None and x is not None]
    x0 = min(xs) if xs else 0.0
    x1 = max(xs) if xs else 1.0
    steps = [s for s in fig.series if s.kind == "step" and len(s.xs) > 1]
    if steps:
        x1 = max(x1, max(s.xs[-1] + (s.xs[1] - s.xs[0]) for s in steps))
    if fig.x_min is not None:
        x0 = min(x0, fig.x_min)
    return x0, x1


def _y_extent(fig: Figure) -> tuple[float, float]:
    ys = [y for s in fig.series for y in s.ys if y is not None]
    y0 = min(ys) if ys else 0.0
    y1 = max(ys) if ys else 1.0
    if fig.y_min is not None:
        y0 = min(y0, fig.y_min)
    if fig.y_max is not None and (not ys or max(ys) <= fig.y_max):
        y1 = fig.y_max
    return y0, y1


def render(fig: Figure) -> str:
    """The figure as one ``<svg>`` element."""
    x0, x1, y0, y1 = _extent(fig)
    xt = nice_ticks(x0, x1) if fig.categories is None else list(range(len(fig.categories)))
    yt = nice_ticks(y0, y1)
    if fig.categories is None:
        x0, x1 = min(x0, xt[0]), max(x1, xt[-1])
    y0, y1 = min(y0, yt[0]), max(y1, yt[-1])
    pw, ph = W - ML - MR, H - MT - MB

    def sx(x: float) -> float:
        return ML + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return MT + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg id="fig-{escape(fig.key)}" class="chart" '
           f'viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="{escape(fig.title)}">',
           f'<text x="{W / 2}" y="20" text-anchor="middle" class="ct">{escape(fig.title)}</text>']
    for v in yt:
        y = sy(v)
        out.append(f'<line x1="{ML}" x2="{ML + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{ML - 6}" y="{y + 4:.1f}" text-anchor="end" class="tk">'
                   f'{fmt_tick(v)}</text>')
    for i, v in enumerate(xt):
        x = sx(v)
        label = fig.categories[i] if fig.categories is not None else fmt_tick(v)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MT + ph}" y2="{MT + ph + 4}" '
                   f'class="axis"/><text x="{x:.1f}" y="{MT + ph + 16}" text-anchor="middle" '
                   f'class="tk">{escape(str(label))}</text>')
    out.append(f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" class="frame"/>')
    out.append(f'<text x="{ML + pw / 2}" y="{MT + ph + 32}" text-anchor="middle" class="al">'
               f'{escape(fig.x_label)}</text>')
    out.append(f'<text transform="translate(14 {MT + ph / 2}) rotate(-90)" text-anchor="middle" '
               f'class="al">{escape(fig.y_label)}</text>')
    bars = [s for s in fig.series if s.kind == "bar"]
    for s in fig.series:
        out.extend(_series(s, sx, sy, bars, y0, pw))
    # legend
    lx: float = ML
    ly = H - 18
    for s in fig.series:
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        if s.kind in ("scatter", "bar"):
            out.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="10" fill="{s.color}"/>')
        else:
            out.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 3}" y2="{ly - 3}" '
                       f'stroke="{s.color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 22}" y="{ly}" class="lg">{escape(s.label)}</text>')
        lx += 30 + 6.2 * len(s.label)
        if lx > W - 120:
            lx, ly = ML, ly + 14
    out.append("</svg>")
    return "".join(out)


def _series(s: Series, sx: Scale, sy: Scale, bars: list[Series], y0: float, pw: float
            ) -> list[str]:
    out: list[str] = []
    dash = ' stroke-dasharray="5 3"' if s.dashed else ""
    if s.kind == "scatter":
        for x, y in zip(s.xs, s.ys):
            if y is None or x is None:
                continue
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{s.color}">'
                       f'<title>{escape(s.label)}: {x:,.4g}, {y:,.4g}</title></circle>')
        return out
    if s.kind == "bar":
        k, i = len(bars), bars.index(s)
        slot = pw / max(len(s.xs), 1) * 0.8
        bw = slot / k
        for x, y in zip(s.xs, s.ys):
            if y is None:
                continue
            left = sx(x) - slot / 2 + i * bw
            top, base = sy(y), sy(max(y0, 0.0))
            out.append(f'<rect x="{left:.1f}" y="{min(top, base):.1f}" width="{bw * 0.92:.1f}" '
                       f'height="{abs(base - top):.1f}" fill="{s.color}"><title>'
                       f'{escape(s.label)}: {y:,.2f}</title></rect>')
        return out
    step = s.kind == "step" and len(s.xs) > 1
    width = (s.xs[1] - s.xs[0]) if step else 0.0
    segs: list[list[str]] = [[]]
    for x, y in zip(s.xs, s.ys):
        if y is None or x is None:
            if segs[-1]:
                segs.append([])
            continue
        if step:
            segs[-1].append(f"{sx(x):.1f},{sy(y):.1f} {sx(x + width):.1f},{sy(y):.1f}")
        else:
            segs[-1].append(f"{sx(x):.1f},{sy(y):.1f}")
    for seg in segs:
        if len(seg) == 1 and not step:
            cx, cy = seg[0].split(",")
            out.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{s.color}"/>')
        elif seg:
            out.append(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{s.color}" '
                       f'stroke-width="1.8"{dash}/>')
    return out
