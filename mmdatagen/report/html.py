"""``report.html``: one self-contained page (inline CSS and SVG, no network) per bench/ab/compare/sweep.

Sections: summary table (one run, the A/B table, or the sweep table with 95 % confidence
intervals), goodput, TTFT and ITL distributions (CDF), per-run timelines (requests in flight,
throughput per second, cache hit rate over time; server running/waiting when /metrics was
scraped), predicted beside measured cache hits, and for sweeps throughput against TTFT p50/p99
with the Pareto front and hit rate against cache size. The same figures are written as PNGs.
"""
from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Literal, TypedDict

from .. import __version__
from ..exportmodel import SweepDoc, SweepPoint
from ..outcomes import fault_name
from . import figures as F
from . import svg

REPORT_NAME = "report.html"
PLOTS_DIR = "plots"
ReportKind = Literal["bench", "ab", "compare", "sweep", "whatif"]  # the page's data-kind


class ReportFiles(TypedDict):
    """What :meth:`Report.write` wrote: the page and its PNG plots (none without ``--png``)."""

    html: Path
    pngs: list[Path]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1420px;padding:0 16px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:12px}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:right}th{background:#f5f5f5}
td:first-child,th:first-child{text-align:left}.grid{stroke:#eee}.axis{stroke:#888}
.frame{fill:none;stroke:#bbb}.ct{font-size:13px;font-weight:600}.tk{font-size:10px;fill:#555}
.al{font-size:11px;fill:#333}.lg{font-size:10.5px;fill:#333}.charts{display:flex;flex-wrap:wrap;
gap:8px}.note{color:#666;font-size:12px}
"""
# One small script: marks the page as rendered (the browser test checks it ran without errors)
# and lets a click on a table header sort that table.
JS = """
document.querySelectorAll('table.sortable th').forEach(function(th,i){th.style.cursor='pointer';
th.addEventListener('click',function(){var tb=th.closest('table').tBodies[0];
var rows=Array.prototype.slice.call(tb.rows);rows.sort(function(a,b){
var x=parseFloat(a.cells[i].dataset.value),y=parseFloat(b.cells[i].dataset.value);
if(isNaN(x)||isNaN(y)){return a.cells[i].textContent.localeCompare(b.cells[i].textContent);}
return x-y;});rows.forEach(function(r){tb.appendChild(r);});});});
document.body.dataset.rendered='1';
"""


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "N/A"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return escape(str(v))


def cell(v: Any, metric: str | None = None, digits: int = 2, cls: str = "") -> str:
    attrs = ""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        attrs += f' data-value="{v!r}"'
    if metric:
        attrs += f' data-metric="{escape(metric)}"'
    if cls:
        attrs += f' class="{cls}"'
    return f"<td{attrs}>{fmt(v, digits)}</td>"


def table(head: list[str], rows: list[str], cls: str = "") -> str:
    h = "".join(f"<th>{escape(x)}</th>" for x in head)
    c = f' class="{cls}"' if cls else ""
    return f"<table{c}><thead><tr>{h}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


# label, export tag, statistic (the seeds' A/B rows plus goodput and counts)
SUMMARY_ROWS: tuple[tuple[str, str, str], ...] = (
    ("Output TPS (tok/s)", "output_token_throughput", "avg"),
    ("Request throughput (req/s)", "request_throughput", "avg"),
    ("TTFT avg (ms)", "time_to_first_token", "avg"),
    ("TTFT p50 (ms)", "time_to_first_token", "p50"),
    ("TTFT p99 (ms)", "time_to_first_token", "p99"),
    ("ITL avg (ms)", "inter_token_latency", "avg"),
    ("ITL p99 (ms)", "inter_token_latency", "p99"),
    ("Request latency avg (ms)", "request_latency", "avg"),
    ("Request latency p99 (ms)", "request_latency", "p99"),
    ("Goodput (req/s)", "goodput", "avg"),
    ("Good requests", "good_request_count", "avg"),
    ("Requests (ok)", "request_count", "avg"),
    ("Errors", "error_request_count", "avg"),
    ("Benchmark duration (s)", "benchmark_duration", "avg"),
)


def value(ex: dict[str, Any], tag: str, stat: str) -> float | int | None:
    b = ex.get(tag)
    if not isinstance(b, dict):
        return None
    v = b.get(stat)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def hit_rates(ex: dict[str, Any]) -> dict[str, float | None]:
    c = ex.get("image_cache") or {}
    return {k: (c.get(src) or {}).get("hit_rate") for k, src in
            (("predicted", "predicted"), ("measured", "measured"), ("server", "server_metrics"))}


@dataclass
class Report:
    kind: ReportKind
    title: str
    subtitle: str = ""
    sections: list[tuple[str, str]] = field(default_factory=list)
    figures: list[F.Figure] = field(default_factory=list)

    def add(self, heading: str, body: str) -> None:
        self.sections.append((heading, body))

    def add_figures(self, heading: str, figs: Sequence[F.Figure | None], note: str = "") -> None:
        shown = [f for f in figs if f is not None and not f.empty()]
        if not shown:
            return
        self.figures.extend(shown)
        body = '<div class="charts">' + "".join(svg.render(f) for f in shown) + "</div>"
        if note:
            body += f'<p class="note">{escape(note)}</p>'
        self.add(heading, body)

    def html(self) -> str:
        now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        toc = "".join(f'<li><a href="#s{i}">{escape(h)}</a></li>'
                      for i, (h, _) in enumerate(self.sections))
        body = "".join(f'<section id="s{i}"><h2>{escape(h)}</h2>{b}</section>'
                       for i, (h, b) in enumerate(self.sections))
        return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
                f'<meta name="viewport" content="width=device-width,initial-scale=1">'
                f"<title>{escape(self.title)}</title><style>{CSS}</style></head>"
                f'<body data-kind="{escape(self.kind)}"><h1>{escape(self.title)}</h1>'
                f'<p class="meta">{escape(self.subtitle)} · mmdatagen {__version__} · built {now}'
                f"</p><ul>{toc}</ul>{body}<script>{JS}</script></body></html>")

    def write(self, out_dir: Path, png: bool = False) -> ReportFiles:
        """Write ``report.html``; with ``png`` also ``plots/<figure>.png`` (needs matplotlib)."""
        from ..errors import SpecError, UserError
        from ..io.atomic import atomic_write_bytes
        from . import png as png_mod

        out_dir = Path(out_dir)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create {out_dir}: {exc.strerror}") from None
        path = out_dir / REPORT_NAME
        atomic_write_bytes(path, self.html().encode())
        res: ReportFiles = {"html": path, "pngs": []}
        if png:
            if not png_mod.available():
                raise SpecError("png", "needs matplotlib: pip install matplotlib "
                                f"(report.html is written: {path})")
            plots = out_dir / PLOTS_DIR
            plots.mkdir(exist_ok=True)
            res["pngs"] = png_mod.write_pngs(self.figures, plots)
        return res


def _summary_rows(runs: F.Runs, delta: bool) -> str:
    head = ["Metric", *[label for label, _ in runs]] + (["Delta %"] if delta else [])
    rows = []
    for label, tag, stat in SUMMARY_ROWS:
        vals = [value(ex, tag, stat) for _, ex in runs]
        if all(v is None for v in vals):
            continue
        tds = "".join(cell(v, f"{tag}.{stat}") for v in vals)
        if delta:
            a, b = vals
            d = (a - b) / b * 100 if a is not None and b not in (None, 0) else None
            tds += cell(d, "delta", 1)
        rows.append(f"<tr><td>{escape(label)}</td>{tds}</tr>")
    for key, label in (("predicted", "Image cache hit rate, predicted (%)"),
                       ("measured", "Image cache hit rate, measured by headers (%)"),
                       ("server", "Image cache hit rate, server /metrics (%)")):
        vals = [hit_rates(ex)[key] for _, ex in runs]
        if all(v is None for v in vals):
            continue
        tds = "".join(cell(None if v is None else v * 100, f"hit_rate.{key}") for v in vals)
        rows.append(f"<tr><td>{escape(label)}</td>{tds}{'<td></td>' if delta else ''}</tr>")
    return table(head, rows)


def _goodput_note(runs: F.Runs) -> str:
    for _, ex in runs:
        slos = (ex.get("goodput") or {}).get("slos")
        if slos:
            objs = ", ".join(f"{k} <= {v:g}" for k, v in slos.items())
            return (f"Goodput: successful requests per second meeting every objective ({objs}; "
                    "ms), the definition of vLLM's and AIPerf's --goodput.")
    return ""


def _cache_table(runs: F.Runs) -> str:
    rows = []
    for label, ex in runs:
        c = ex.get("image_cache") or {}
        p, m, s = c.get("predicted") or {}, c.get("measured") or {}, c.get("server_metrics") or {}
        rows.append(
            f"<tr><td>{escape(label)}</td>"
            + cell(p.get("hits"), "predicted.hits") + cell(p.get("references"), "predicted.refs")
            + cell(None if p.get("hit_rate") is None else p["hit_rate"] * 100, "predicted.rate")
            + cell(m.get("hits"), "measured.hits")
            + cell(None if m.get("hits") is None else m["hits"] + m["misses"], "measured.refs")
            + cell(None if m.get("hit_rate") is None else m["hit_rate"] * 100, "measured.rate")
            + cell(None if s.get("hit_rate") is None else s["hit_rate"] * 100, "server.rate")
            + "</tr>")
    notes = [f"{label}: {(ex.get('image_cache') or {}).get('predicted', {}).get('note')}"
             for label, ex in runs
             if ((ex.get("image_cache") or {}).get("predicted") or {}).get("note")]
    head = ["Run", "Predicted hits", "References", "Predicted %", "Measured hits", "References",
            "Measured %", "Server /metrics %"]
    extra = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    return table(head, rows) + extra + _band_table(runs)


def _band_table(runs: F.Runs) -> str:
    """The order band of each prediction, and where the measured hits fall in it."""
    rows = []
    for label, ex in runs:
        band = ((ex.get("image_cache") or {}).get("predicted") or {}).get("band")
        if not isinstance(band, dict) or band.get("low") is None:
            continue
        inside = band.get("measured_inside")
        where = "not measured" if inside is None else "inside" if inside else "OUTSIDE"
        rows.append(f"<tr><td>{escape(label)}</td>" + cell(band["low"], "band.low")
                    + cell(band["high"], "band.high") + cell(band["width"], "band.width")
                    + cell(band.get("measured"), "band.measured")
                    + f"<td>{escape(where)}</td><td>{escape(str(band.get('method')))}</td>"
                    + f"<td>{escape(_any_order(band.get('any_order')))}</td></tr>")
    if not rows:
        return ""
    head = ["Run", "Band low", "Band high", "Width", "Measured hits", "Measured", "Method",
            "Any scheduler"]
    note = ("The band: the lowest and highest predicted hits over every order in which the "
            "server may have seen the requests (width 0: the order is known and the prediction "
            "is exact). Against a real engine the band assumes first come, first served (vLLM's, "
            "SGLang's and Dynamo's default): lookups follow the first tokens' order, and first "
            "tokens of one engine step may come in either order. 'Any scheduler' is the band over "
            "every order the send and first-byte times allow. A server counter covers every "
            "request, warmup included, and is compared with the band over all of them.")
    return table(head, rows) + f'<p class="note">{escape(note)}</p>'


def _any_order(band: dict | None) -> str:
    if not isinstance(band, dict):
        return "-"
    inside = band.get("measured_inside")
    where = "" if inside is None else ", measured inside" if inside else ", measured OUTSIDE"
    return f"{band['low']:,} to {band['high']:,} (width {band['width']:,}{where})"


def _faults_section(runs: F.Runs) -> str:
    """Engine faults: requests the server failed after taking them in, and known engine bugs."""
    rows = []
    for label, ex in runs:
        block = ex.get("engine_faults") or {}
        if not block.get("count"):
            continue
        statuses = ", ".join(f"{s} x{n}" for s, n in sorted(block["statuses"].items()))
        known = ", ".join(f"{fault_name(k)} ({k}) x{n}" for k, n in
                          sorted((block.get("known") or {}).items())) or "none"
        rows.append(f"<tr><td>{escape(label)}</td>" + cell(block["count"], "faults.count")
                    + f"<td>{escape(statuses)}</td><td>{escape(known)}</td>"
                    f"<td>{escape(str(block.get('first_message') or '')[:300])}</td></tr>")
    if not rows:
        return ""
    return table(["Run", "Faults", "Statuses", "Known engine bugs", "First message"], rows)


def _server_note(runs: F.Runs) -> str:
    notes = []
    for label, ex in runs:
        s = ex.get("server_metrics_timeseries")
        if isinstance(s, dict) and not s.get("available"):
            notes.append(f"{label}: server metrics not collected ({s.get('reason')}).")
    return " ".join(notes)


def runs_report(kind: ReportKind, runs: F.Runs, title: str,
                comparison: dict[str, Any] | None = None) -> Report:
    """bench (one run) or ab/compare (two runs): tables, CDFs, timelines, cache."""
    first = runs[0][1].get("input_config") or {}
    sub = f"dataset {first.get('input_file') or first.get('dataset') or '?'}"
    rep = Report(kind, title, sub)
    delta = len(runs) == 2
    body = _summary_rows(runs, delta)
    if comparison is not None:
        body += '<p class="note">Delta % = (A - B) / B, as in the seeds\' A/B tables.</p>'
    note = _goodput_note(runs)
    if note:
        body += f'<p class="note">{escape(note)}</p>'
    rep.add("Summary" if len(runs) == 1 else "A/B table", body)
    rep.add_figures("Latency distributions (CDF)", [
        F.cdf_figure(runs, "time_to_first_token", "TTFT", "cdf_ttft"),
        F.cdf_figure(runs, "inter_token_latency", "ITL", "cdf_itl"),
        F.cdf_figure(runs, "request_latency", "Request latency", "cdf_latency")],
        note="From 201 stored quantiles per run (the export's percentile block for exports "
             "without them, e.g. AIPerf's).")
    for i, (label, ex) in enumerate(runs):
        tag = "run" if len(runs) == 1 else f"run{chr(97 + i)}"
        rep.add_figures(f"Timeline: {label}" if len(runs) > 1 else "Timeline",
                        F.timeline_figures(label if len(runs) > 1 else "", ex, tag),
                        note=_timeline_note(ex))
    cache = F.cache_figure(runs)
    if cache is not None or any((ex.get("image_cache") or {}).get("predicted") for _, ex in runs):
        rep.add("Image cache: predicted beside measured", _cache_table(runs))
        rep.add_figures("Image cache hit rate", [cache])
    faults = _faults_section(runs)
    if faults:
        rep.add("Engine faults", faults)
    stages = _stages_section(runs)
    if stages:
        rep.add("Server stages", stages)
    srv = _server_note(runs)
    if srv:
        rep.add("Server metrics", f'<p class="note">{escape(srv)}</p>')
    return rep


def _stages_section(runs: F.Runs) -> str:
    """Where each run's requests spent their time on the server (``server_stages``)."""
    from ..metrics import STAGES

    rows = []
    for label, ex in runs:
        st = ex.get("server_stages") or {}
        if st.get("available"):
            avg = st["avg_ms"]
            rows.append(f"<tr><td>{escape(label)}</td>"
                        + "".join(cell(avg.get(k), f"stages.{k}") for k in (*STAGES, "ttft"))
                        + cell(st.get("requests"), "stages.requests") + "</tr>")
    if not rows:
        return ""
    return (table(["Run", "Frontend (ms)", "Queue (ms)", "Prefill (ms)", "Decode (ms)",
                   "Server TTFT (ms)", "Requests"], rows)
            + '<p class="note">Mean per request on the server\'s own clock (vLLM\'s request '
              "histograms, or the simulator's), warmup included: before the scheduler "
              "(rendering, image loading and preprocessing), waiting in its queue, scheduled "
              "to first token, first to last token.</p>")


def _timeline_note(ex: dict[str, Any]) -> str:
    tl = ex.get("timeline") or {}
    if not tl:
        return "No timeline stored in this export."
    s = ex.get("server_metrics_timeseries") or {}
    parts = [f"Bins of {tl.get('bin_s'):g} s from the first profiling request; hit rates by "
             "request start."]
    if s.get("available"):
        parts.append(f"Server series scraped from {s.get('url')}/metrics every "
                     f"{s.get('interval_s'):g} s.")
    return " ".join(parts)


SWEEP_COLS: tuple[tuple[str, str, int], ...] = (
    ("output_token_throughput", "Output TPS", 1), ("request_throughput", "Req/s", 2),
    ("ttft_avg", "TTFT avg ms", 1), ("ttft_p50", "TTFT p50 ms", 1), ("ttft_p99", "TTFT p99 ms", 1),
    ("itl_avg", "ITL avg ms", 2), ("latency_avg", "Latency avg ms", 1),
    ("hit_rate", "Hit rate %", 1), ("predicted_hit_rate", "Predicted hit rate %", 1),
    ("goodput", "Goodput req/s", 2), ("error_count", "Errors", 0))


def sweep_report(doc: SweepDoc, representatives: dict[str, dict[str, Any]] | None = None
                 ) -> Report:
    """The sweep: table of means with 95 % CIs, Pareto plots, hit rate vs cache size, CDFs."""
    points = doc["points"]
    rep = Report("sweep", "mmdatagen sweep",
                 f"dataset {doc.get('dataset')} · {len(points)} points x {doc.get('repeats')} "
                 f"repeats · target {doc.get('target')}")
    rep.add("Sweep table", _sweep_table(doc))
    rep.add_figures("Throughput against latency (Pareto front)", [
        F.pareto_figure(points, "p50", "pareto_ttft_p50"),
        F.pareto_figure(points, "p99", "pareto_ttft_p99")],
        note="Each point is a sweep point (mean of its repeats); the dashed line joins the points "
             "no other point beats on both throughput and TTFT.")
    unit = next((u for ex in (representatives or {}).values()
                 if (u := ((ex.get("image_cache") or {}).get("predicted") or {}).get("unit"))),
                "GiB")  # the sizes' unit: their cache target's, as the predictions name it
    rep.add_figures("Hit rate against cache size", [F.cache_size_figure(points, unit=unit)],
                    note="Measured: the simulator's/server's hits over the profiling requests; "
                         "predicted: each run's prediction (the loader's replay of the requests "
                         "it sent; with --virtual, mmdatagen analyze's LRU in file order).")
    representatives = representatives or {}
    reps = [(p["name"], representatives[p["name"]]) for p in points
            if representatives.get(p["name"])]
    if reps:
        _add_first_repeats(rep, reps)
    return rep


def _sweep_table(doc: SweepDoc) -> str:
    """The sortable table of every point (mean ± CI half-width of each metric any point has)."""
    points = doc["points"]
    present = [c for c in SWEEP_COLS
               if any(F.summary_mean(p, c[0]) is not None for p in points)]
    params = list(doc.get("grid") or {})
    head = ["Point", *params, *[c[1] for c in present]]
    rows = [f"<tr><td>{escape(p['name'])}</td>{_sweep_cells(p, params, present)}</tr>"
            for p in points]
    body = table(head, rows, "sortable")
    body += ('<p class="note">Mean over repeats ± half-width of the 95 % confidence interval '
             "(Student t, n-1 degrees of freedom); sweep.csv has every repeat, sweep.json the "
             "standard deviation, min and max. Click a header to sort.</p>")
    note = _goodput_note([(p["name"], {"goodput": {"slos": doc.get("goodput_slos")}})
                          for p in points[:1]])
    if note:
        body += f'<p class="note">{escape(note)}</p>'
    return body


def _sweep_cells(p: SweepPoint, params: list[str],
                 present: Sequence[tuple[str, str, int]]) -> str:
    """One point's cells: its parameters, then mean ± half-width per metric (rates in %)."""
    tds = "".join(
        f'<td data-metric="param.{escape(k)}" data-value="{v!r}">{v:g}</td>'
        if isinstance(v := p["params"].get(k), float) else cell(v, f"param.{k}")
        for k in params)
    for key, _, digits in present:
        s = p["summary"].get(key)
        m, half = (None, None) if s is None else (s["mean"], s["ci95_half"])
        if key.endswith("hit_rate"):  # fractions -> %
            m = None if m is None else m * 100
            half = None if half is None else half * 100
        txt = fmt(m, digits) + ("" if half is None else f" ± {fmt(half, digits)}")
        attr = "" if m is None else f' data-value="{m!r}"'
        tds += f'<td data-metric="{key}"{attr}>{txt}</td>'
    return tds


def _add_first_repeats(rep: Report, reps: F.Runs) -> None:
    """CDFs of each point's first repeat, and the last point's timeline."""
    rep.add_figures("Latency distributions (CDF, first repeat of each point)", [
        F.cdf_figure(reps, "time_to_first_token", "TTFT", "cdf_ttft"),
        F.cdf_figure(reps, "inter_token_latency", "ITL", "cdf_itl")])
    label, last = reps[-1]
    rep.add_figures(f"Timeline: {label} (first repeat)",
                    F.timeline_figures(label, last, "last_point"), note=_timeline_note(last))


WHATIF_COLS = (("hit_rate", "Hit rate %"), ("time_to_first_token", "TTFT avg ms"),
               ("ttft_p50", "TTFT p50 ms"), ("ttft_p99", "TTFT p99 ms"),
               ("request_throughput", "Req/s"), ("output_token_throughput", "Output TPS"))


def whatif_report(doc: dict[str, Any]) -> Report:
    """``simulate --cache-size a,b,c``'s report (its sweep.json ``doc``): the table (each value
    with its interval from the calibration's uncertainty, when the profile has one) and the
    curves against cache size, with the knee and where the SLO is met."""
    unit = doc.get("unit", "GiB")
    rep = Report("whatif", "mmdatagen simulate: what each cache size buys",
                 f"dataset {doc.get('dataset')} · profile {doc.get('profile')} · simulated "
                 "(mmdatagen's performance model, not a measurement)")
    head = [f"Cache {unit}", *(h for _, h in WHATIF_COLS)]
    rows = []
    for r in sorted(doc["rows"], key=lambda r: r["cache_gb"]):
        cells = [cell(r["cache_gb"])]
        for key, _ in WHATIF_COLS:
            band = (r.get("interval") or {}).get(key)
            text = fmt(r.get(key)) + (f" [{fmt(band[0])} - {fmt(band[1])}]" if band else "")
            cells.append(f"<td>{escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    rep.add("What-if table", table(head, rows))
    method = doc.get("interval")
    rep.add_figures("Against cache size", F.whatif_figures(doc), note=(
        f"Intervals: {method}." if method else "No intervals: the profile carries no "
        "calibration uncertainty (fit one with mmdatagen calibrate).")
        + " Knee: the size where the TTFT avg curve is furthest below the straight line from "
        "the smallest to the largest size. SLO met: the smallest size whose value (the "
        "interval's upper end) is within the objective.")
    return rep
