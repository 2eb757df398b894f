"""The AIPerf-style console table of an export (per-request metrics, run values, cache lines),
and the progress bar long work shows on stderr."""
from __future__ import annotations

import math
import sys
from typing import Any, Protocol

from .metrics import RECORD_METRICS
from .outcomes import fault_lines, fault_name


class Bar(Protocol):
    """What long work asks of a progress bar (tqdm's, or ``NoBar``)."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> object: ...


class NoBar:
    """The bar of a quiet run or of a stderr that is no terminal: it shows nothing, and tqdm
    is not imported (about 0.1 s of a process)."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress_bar(total: int | None, quiet: bool, **options: Any) -> Any:
    """A tqdm bar on stderr (``options``: its desc, unit, ...), cleared when done; a ``NoBar``
    with ``quiet`` or when stderr is not a terminal. A context manager either way."""
    if quiet or not sys.stderr.isatty():
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, leave=False, **options)


COLUMNS = ("avg", "min", "max", "p99", "p90", "p50", "std")
RUN_ROWS = (("Output Token Throughput (tokens/sec)", "output_token_throughput"),
            ("Request Throughput (requests/sec)", "request_throughput"),
            ("Request Count (requests)", "request_count"),
            ("Error Request Count (requests)", "error_request_count"),
            ("Benchmark Duration (sec)", "benchmark_duration"))


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "N/A"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.2f}"


def _metric_rows(export: dict) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("Metric", *COLUMNS)]
    for tag, (unit, header) in RECORD_METRICS.items():
        b = export.get(tag)
        if b and b.get("count"):
            rows.append((f"{header} ({unit})", *(_fmt(b.get(c)) for c in COLUMNS)))
    for label, tag in RUN_ROWS:
        b = export.get(tag) or {}
        rows.append((label, _fmt(b.get("avg")), *("" for _ in COLUMNS[1:])))
    return rows


def _align(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _hit_lines(cache: dict) -> list[str]:
    out = []
    meas, pred, srv = cache.get("measured"), cache.get("predicted"), cache.get("server_metrics")
    if meas and meas.get("hit_rate") is not None:
        out.append(f"Image cache hits (measured, headers): {meas['hits']:,}/"
                   f"{meas['hits'] + meas['misses']:,} = {meas['hit_rate']:.1%}")
    if srv and srv.get("hit_rate") is not None:
        out.append(f"Image cache hits (measured, {srv.get('source')}): {srv['hits']:,}/"
                   f"{srv['queries']:,} = {srv['hit_rate']:.1%}")
    if pred and pred.get("hit_rate") is not None:
        out.append(f"Image cache hits (predicted, {pred.get('model', '?')}, "
                   f"{pred.get('capacity', '?')} {pred.get('unit', 'GiB')}): "
                   f"{pred['hits']:,}/{pred['references']:,}"
                   f" = {pred['hit_rate']:.1%}")
        out += band_lines(pred.get("band"))
        for kind, n in (pred.get("faults") or {}).items():
            out.append(f"  predicted engine faults: {n:,} requests fail inside the engine "
                       f"({fault_name(kind)}, {kind})")
    elif pred and pred.get("note"):
        out.append(f"Image cache prediction: {pred['note']}")
    return out


def band_lines(band: dict | None, label: str = "order band") -> list[str]:
    """The order band: its bounds and width, and whether the measured hits lie inside; then
    the band over any scheduler's order, when the first is a first-come-first-served one."""
    if not band or band.get("low") is None:
        return []
    fcfs = isinstance(band.get("any_order"), dict)
    if band["width"] == 0:
        line = f"  {label}: exact ({band.get('method')}), width 0"
    else:
        what = ("that first come, first served and the first-token times allow" if fcfs else
                "the send and first-byte times allow")
        line = (f"  {label}: {band['low']:,} to {band['high']:,} hits (width "
                f"{band['width']:,}) over every arrival order {what} ({band.get('method')})")
    out = [line] + _inside_line(band)
    if fcfs:
        out += band_lines(band["any_order"], "band for any scheduler")
    return out


def _inside_line(band: dict) -> list[str]:
    out = []
    inside = band.get("measured_inside")
    if inside is not None:
        whole = band.get("all_requests") or band
        lo, hi = (band["low"], band["high"]) if "headers" in str(band.get("measured_by")) \
            else (whole["low"], whole["high"])
        out.append(f"  measured {band['measured']:,} hits ({band.get('measured_by')}): "
                   f"{'inside' if inside else 'OUTSIDE'} the band [{lo:,}, {hi:,}]")
    return out


def _ttft_split_lines(cache: dict) -> list[str]:
    out = []
    for key, label in (("time_to_first_token_all_hit", "all images hit"),
                       ("time_to_first_token_not_all_hit", "some image missed")):
        b = cache.get(key) or {}
        if b.get("count"):
            out.append(f"TTFT, {label}: avg {_fmt(b['avg'])} ms, p50 {_fmt(b['p50'])} ms "
                       f"(n={b['count']:,})")
    return out


def _stage_lines(export: dict) -> list[str]:
    """Where a request's time went on the server (``server_stages``), when it said."""
    st = export.get("server_stages") or {}
    if not st.get("available"):
        return []
    avg = st["avg_ms"]
    return [f"Server stages, mean per request: frontend {_fmt(avg['frontend'])} ms, queue "
            f"{_fmt(avg['queue'])} ms, prefill {_fmt(avg['prefill'])} ms, decode "
            f"{_fmt(avg['decode'])} ms (n={st['requests']:,}, warmup included)"]


def _error_lines(export: dict) -> list[str]:
    out = fault_lines(export.get("engine_faults"))
    for e in export.get("error_summary") or []:
        d = e["error_details"]
        out.append(f"Error x{e['count']:,}: {d.get('type')} {d.get('code') or ''} "
                   f"{(d.get('message') or '')[:100]}".rstrip())
    if export.get("was_cancelled"):
        out.append("Run was cancelled: partial results.")
    return out


def console_table(export: dict) -> str:
    """AIPerf-style console table: per-request metrics with avg/min/max/p99/p90/p50/std."""
    cache = export.get("image_cache") or {}
    extra = (_hit_lines(cache) + _ttft_split_lines(cache) + _stage_lines(export)
             + _error_lines(export))
    return "\n".join(_align(_metric_rows(export)) + ([""] + extra if extra else []))
