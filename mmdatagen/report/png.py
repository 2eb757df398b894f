"""The same :class:`~mmdatagen.report.figures.Figure` objects as PNG files (matplotlib)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .figures import Figure, Series

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_pngs(figs: list[Figure], out_dir: Path) -> list[Path]:
    """One ``<key>.png`` per figure in ``out_dir``; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io.atomic import atomic_open

    paths = []
    for fig in figs:
        f, ax = plt.subplots(figsize=(7.2, 3.6))
        bars = [s for s in fig.series if s.kind == "bar"]
        for s in fig.series:
            _draw(ax, s, bars)
        _axes(ax, fig)
        f.tight_layout()
        path = Path(out_dir) / f"{fig.key}.png"
        with atomic_open(path, "wb") as fh:
            f.savefig(fh, format="png", dpi=110)
        plt.close(f)
        paths.append(path)
    return paths


def _draw(ax: Axes, s: Series, bars: list[Series]) -> None:
    """One series: gaps (None) as NaN, so lines break where the SVG's do."""
    ls = "--" if s.dashed else "-"
    ys = [float("nan") if y is None else y for y in s.ys]
    xs = list(s.xs)
    if s.kind == "scatter":
        ax.scatter(xs, ys, color=s.color, label=s.label, zorder=3)
    elif s.kind == "bar":
        k, i = len(bars), bars.index(s)
        w = 0.8 / k
        ax.bar([x - 0.4 + (i + 0.5) * w for x in xs], ys, w, color=s.color, label=s.label)
    elif s.kind == "step":
        width = xs[1] - xs[0] if len(xs) > 1 else 1.0
        ax.step(xs + [xs[-1] + width], ys + [ys[-1]], where="post", color=s.color,
                linestyle=ls, label=s.label)
    else:
        ax.plot(xs, ys, color=s.color, linestyle=ls, label=s.label,
                marker="o" if len(xs) < 30 else None, markersize=3)


def _axes(ax: Axes, fig: Figure) -> None:
    """Category ticks, the figure's bounds, title, labels, grid and legend."""
    if fig.categories is not None:
        ax.set_xticks(range(len(fig.categories)))
        ax.set_xticklabels(fig.categories)
    if fig.y_min is not None:
        ax.set_ylim(bottom=fig.y_min)
    if fig.y_max is not None:
        ax.set_ylim(top=fig.y_max)
    if fig.x_min is not None:
        ax.set_xlim(left=fig.x_min)
    ax.set_title(fig.title, fontsize=10)
    ax.set_xlabel(fig.x_label)
    ax.set_ylabel(fig.y_label)
    ax.grid(alpha=0.3)
    if fig.series:
        ax.legend(fontsize=7)
