"""Printing and writing analysis results: text report, sweep table, curve CSV/JSON, plot."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import orjson

from ..errors import SpecError
from ..io.atomic import atomic_open
from .predict import GIB, Analysis

PLOT_POINTS = 20_000


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _gib(b: int | None) -> str:
    if b is None:
        return "not reached"
    return f"{b / GIB:.3f} GiB" if b < 100 * GIB else f"{b / GIB:,.1f} GiB"


def _mib(b: float) -> str:
    return f"{b / (1 << 20):.2f} MiB"


def _size(x: int | None, unit: str) -> str:
    """A capacity in the entry unit (bytes or tokens), in the target's own unit."""
    if x is None:
        return "not reached"
    if unit == "tokens":
        return f"{x:,} tokens"
    if unit == "MiB":
        return f"{x / (1 << 20):,.1f} MiB"
    return _gib(x)


def _entry(x: float, unit: str) -> str:
    """One entry's size: tokens, or MiB."""
    return f"{x:,.0f} tokens" if unit == "tokens" else _mib(x)


def _spread(c: dict) -> str:
    sp = c.get("spread")
    if not sp:
        return ""
    return f"  [{_pct(sp['min'])} .. {_pct(sp['max'])}, median {_pct(sp['median'])}]"


def format_report(a: Analysis) -> str:
    """The human-readable report of one analysis."""
    s = a.summary
    sem = s["semantics"]
    eb = s["entry_bytes"]
    cache = s.get("cache") or {"target": "dynamo-embedding", "unit": "GiB", "flag": ""}
    unit = cache["unit"]
    entry = (lambda b: f"{b:,.0f} tokens") if unit == "tokens" else _mib
    origin = ""
    if s["info"].get("manifest") is True:
        origin = " (from its manifest; no image read)"
    elif s["info"].get("manifest") is False:
        origin = f" (scanned, {s['info'].get('format', '')})"
    lines = [
        f"source                 {s['source']}{origin}",
        f"model                  {s['model']['name']} ({s['model']['bytes_per_token']:,} B/token"
        f"{', DeepStack real width' if s['model']['real_width'] else ''}); entries "
        + (f"{entry(eb['min'])}" if eb["min"] == eb["max"] else
           f"{entry(eb['min'])} .. {entry(eb['max'])} (mean {entry(eb['mean'])})"),
        f"cache                  {cache['target']} ({cache.get('engine', '')}; capacity in "
        f"{unit}: {cache.get('flag', '')})",
        f"cache semantics        key {sem['key']}, insert at {sem['insert']}, oversize "
        f"{sem['oversize']}, dispatch {sem['dispatch']}"
        + (f", {sem['in_flight']} in flight" if sem["in_flight"] else ""),
        f"method                 {sem.get('method', 'one-pass stack curve (exact)')}",
        f"concurrency model      {sem.get('concurrency_model', 'file order')}",
        f"requests               {s['requests']:,} ({s['requests_with_images']:,} with "
        f"{'items' if 'modalities' in s else 'images'})",
        *_front_lines(s),
        f"{_refs_label(s):<23}{s['references']:,}{_per(s, 'references')}",
        f"distinct {'items ' if 'modalities' in s else 'images'}        {s['distinct_images']:,} "
        f"({_size(s['distinct_bytes'], unit)} of entries){_per(s, 'distinct')}",
        f"compulsory misses      {s['compulsory_misses']:,}"
        + (f" ({s['unbounded_misses']:,} misses with an unbounded cache: in-flight duplicates)"
           if s["unbounded_misses"] != s["compulsory_misses"] else ""),
        f"best possible hit rate {_pct(s['best']['hit_rate'])} of "
        f"{'lookups' if 'front' in s else 'references'}, "
        f"{_pct(s['best']['byte_hit_rate'])} of bytes, {s['best']['tokens_saved']:,} encoder "
        "tokens saved",
    ]
    if s["info"].get("image_uuids") and sem["key"] != "uuid":
        lines.append("note: rows carry image_uuids, which replace the content hash in vLLM: "
                     "see --key uuid")
    if not s["references"]:
        lines.append("no image references: an embedding cache has nothing to do here")
    lines += _capacity_lines(s, unit)
    lines += _modality_lines(s, unit)
    lines.append("")
    for t in s["thresholds"]:
        imgs = "not reached" if t["capacity_images"] is None else \
            f"{t['capacity_images']:,} {'entries' if 'modalities' in s else 'images'}"
        lines.append(f"{100 * t['fraction_of_best']:g} % of best ({t['hits']:,} hits) needs "
                     f"{_size(t['capacity_bytes'], unit)} or {imgs}")
    return "\n".join(lines)


def _refs_label(s: dict) -> str:
    if "front" in s:
        return "Dynamo lookups"
    return "item references" if "modalities" in s else "image references"


def _front_lines(s: dict) -> list[str]:
    """A two-tier target's front: what vLLM's encoder cache served before Dynamo's cache."""
    f = s.get("front")
    if not f:
        return []
    return [f"front tier             vLLM's encoder cache of {f['budget_tokens']:,} tokens: "
            f"served {f['hits']:,} of {f['references']:,} references ({_pct(f['hit_rate'])}), "
            f"{f['evictions']:,} evictions; Dynamo's cache is asked for the other "
            f"{f['lookups_behind']:,} (a lookup only on an encoder-cache miss)"]


def _capacity_label(c: dict, unit: str, eb: dict) -> tuple[str, str]:
    """A capacity row's size in the target's unit, and about how many entries it holds."""
    if c["capacity_bytes"] is None:
        return f"{c['capacity_images']:,} images", f"{c['capacity_images']:,}"
    cap = (f"{c['capacity_gib']:g} GiB" if unit == "GiB" else
           f"{c.get('capacity', 0):,.0f} tokens" if unit == "tokens" else
           f"{c.get('capacity', 0):g} {unit}")
    return cap, f"{int(c['capacity_bytes'] // eb['mean']):,}" if eb["mean"] else "-"


def _capacity_lines(s: dict, unit: str) -> list[str]:
    """The table of asked capacities (with the spread over completion orders when shown); a
    two-tier target's shows the connector's counters."""
    if not s["capacities"]:
        return []
    eb = s["entry_bytes"]
    tiered = "front" in s
    head = (f"{'hits':>10} {'misses':>10} {'evictions':>10}" if tiered else
            f"{'byte hits':>9} {'all-hit req':>11}")
    lines = ["", f"{'capacity':>16} {'~entries':>9} {'hit rate':>9} {head} {'tokens saved':>14}"]
    for c in s["capacities"]:
        cap, held = _capacity_label(c, unit, eb)
        cols = (f"{c['hits']:>10,} {c['misses']:>10,} {c['evictions']:>10,}" if tiered else
                f"{_pct(c['byte_hit_rate']):>9} {_pct(c['full_request_rate']):>11}")
        lines.append(f"{cap:>16} {held:>9} {_pct(c['hit_rate']):>9} {cols} "
                     f"{c['tokens_saved']:>14,}{_spread(c)}")
    if tiered:
        lines.append(f"[Dynamo's counters: hit rate of its {s['references']:,} lookups; each "
                     "miss is an encoder run; vLLM's encoder cache served "
                     f"{s['front']['hits']:,} more references at every size]")
    if any(c.get("spread") for c in s["capacities"]):
        lines.append("[spread of the hit rate over completion orders: min .. max, median]")
    return lines


def _per(s: dict, key: str) -> str:
    """`` (image 6, video 6)``: one count per modality of a trace with videos or audio."""
    modal = s.get("modalities")
    if not modal:
        return ""
    return " (" + ", ".join(f"{m} {v[key]:,}" for m, v in modal.items()) + ")"


def _modality_lines(s: dict, unit: str) -> list[str]:
    """Per modality: what it references and, at the best and each asked capacity, its hits
    in the one cache every modality shares."""
    modal = s.get("modalities")
    if not modal:
        return []
    lines = ["", "per modality (one cache holds every modality; rates of the modality's own "
             "references)", f"{'capacity':>16} {'modality':>8} {'references':>10} "
             f"{'mean entry':>14} {'hit rate':>9} {'byte hits':>9} {'tokens saved':>14}"]
    rows = [("best", m, v["best"]) for m, v in modal.items()]
    for c in s["capacities"]:
        cap = (f"{c['capacity_images']:,} images" if c["capacity_bytes"] is None else
               f"{c['capacity_gib']:g} GiB" if unit == "GiB" else
               f"{c.get('capacity', 0):,.0f} {unit}")
        rows += [(cap, m, r) for m, r in c["by_modality"].items()]
    last = None
    for cap, m, r in rows:
        lines.append(f"{cap if cap != last else '':>16} {m:>8} {r['references']:>10,} "
                     f"{_entry(modal[m]['bytes'] / max(modal[m]['references'], 1), unit):>14} "
                     f"{_pct(r['hit_rate']):>9} {_pct(r['byte_hit_rate']):>9} "
                     f"{r['tokens_saved']:>14,}")
        last = cap
    return lines


def format_sweep(analyses: list[tuple[dict, Analysis]]) -> str:
    """One line per (workload parameters, capacity) for sweeps."""
    header = ["workload", "capacity", "best", "hit rate", "byte hits", "all-hit req",
              "90% GiB", "99% GiB", "100% GiB"]
    table = []
    for params, a in analyses:
        s = a.summary
        label = " ".join(f"{k}={v}" for k, v in params.items())
        th = [("-" if t["capacity_bytes"] is None else f"{t['capacity_bytes'] / GIB:.3f}")
              for t in s["thresholds"]]
        caps = s["capacities"] or [None]
        for c in caps:
            if c is None:
                table.append([label, "-", _pct(s["best"]["hit_rate"]), "-", "-", "-", *th])
                continue
            cap = (f"{c['capacity_gib']:g} GiB" if c["capacity_bytes"] is not None
                   else f"{c['capacity_images']} img")
            table.append([label, cap, _pct(s["best"]["hit_rate"]), _pct(c["hit_rate"]),
                          _pct(c["byte_hit_rate"]), _pct(c["full_request_rate"]), *th])
    widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w)  # noqa: E731
                              for i, (v, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), *(fmt(r) for r in table)])


def write_curve(a: Analysis, path: Path) -> None:
    """The full curve as CSV or JSON (by extension), written atomically."""
    path = Path(path)
    cols = a.curve_rows()
    ext = path.suffix.lower()
    if ext not in (".csv", ".json"):
        raise SpecError("curve_path", f"must end in .csv or .json, got {path.name}")
    with atomic_open(path, "wb") as fh:
        if ext == ".json":
            doc = {"sampled": a.curve_sampled, "summary": a.summary,
                   "curve": {k: v.tolist() for k, v in cols.items()}}
            fh.write(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))
            return
        names = list(cols)
        fh.write((",".join(names) + "\n").encode())
        block = 200_000
        n = cols["hits"].size
        for start in range(0, n, block):
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            part = [cols[k][start:start + block].tolist() for k in names]
            w.writerows(zip(*part))
            fh.write(buf.getvalue().encode())


def plot_curve(a: Analysis, path: Path) -> None:
    """Hit rate against cache size with the bound and the asked capacities marked (matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("plot_path", "needs matplotlib: pip install 'mmdatagen[plot]'") from None
    s = a.summary
    cols = a.curve_rows()
    x, y = cols["capacity_gib"], cols["hit_rate"] * 100
    if x.size > PLOT_POINTS:  # a step plot of millions of points: keep an even subset + ends
        pick = np.unique(np.r_[np.linspace(0, x.size - 1, PLOT_POINTS).astype(int), x.size - 1])
        x, y = x[pick], y[pick]
    x, y = np.r_[0.0, x], np.r_[0.0, y]
    top = max(x[-1] * 1.1, max((c["capacity_gib"] or 0 for c in s["capacities"]), default=0) * 1.05,
              1e-6)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.step(np.r_[x, top], np.r_[y, y[-1]], where="post", label="predicted LRU hit rate")
    ax.axhline(100 * s["best"]["hit_rate"], ls="--", color="grey",
               label=f"best possible {_pct(s['best']['hit_rate'])}")
    for c in s["capacities"]:
        if c["capacity_bytes"] is not None:
            ax.axvline(c["capacity_gib"], ls=":", color="tab:red")
            ax.plot([c["capacity_gib"]], [100 * c["hit_rate"]], "o", color="tab:red")
            ax.annotate(f"{c['capacity_gib']:g} GiB: {_pct(c['hit_rate'])}",
                        (c["capacity_gib"], 100 * c["hit_rate"]), textcoords="offset points",
                        xytext=(4, -12), fontsize=8)
    ax.set_xlabel("embedding cache capacity (GiB)")
    ax.set_ylabel("image reference hit rate (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(0, top)
    ax.set_title(f"{Path(str(s['source'])).name} - {s['model']['name']}"
                 + (" (sampled)" if a.curve_sampled else ""), fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(Path(path), "wb") as fh:
        fig.savefig(fh, format="png", dpi=120)
    plt.close(fig)


def to_json(obj) -> bytes:
    """JSON bytes of a summary (or a list of them)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


def render(results: list[tuple[dict, Analysis]], output, note) -> str:
    """Write ``output``'s --curve / --plot files and return what ``analyze`` prints (the report,
    the sweep table or JSON); ``note`` gets remarks meant for stderr."""
    first = results[0][1]
    if output.curve_path is not None:
        write_curve(first, output.curve_path)
        if first.curve_sampled and not output.quiet:
            note(f"note: with --insert completion the curve is simulated at "
                 f"{first.curve.capacity.size} capacities, not exact everywhere")
    if output.plot_path is not None:
        plot_curve(first, output.plot_path)
    if output.as_json:
        doc = first.summary if len(results) == 1 else [
            {"workload": p, **a.summary} for p, a in results]
        return to_json(doc).decode()
    return format_report(first) if len(results) == 1 else format_sweep(results)
