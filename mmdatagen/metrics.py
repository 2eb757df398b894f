"""Per-request records -> AIPerf-shaped metrics, exports and the console table.

Shared by the loader (``mmdatagen bench``, real clocks) and the simulator (``mmdatagen simulate``,
virtual clocks): both produce :class:`RequestRecord` lists and call :func:`build_export`.

Definitions follow aiperf-compat.md exactly:

- TTFT = first content chunk - request start (streaming only).
- Request latency = last content chunk - request start.
- ITL = (latency - TTFT) / (output tokens - 1), only with >= 2 output tokens (streaming only).
- Output token throughput per user = 1 / ITL (per request).
- Benchmark duration = last response - first request start of the profiling phase; throughputs
  divide by it. Warmup requests are excluded from every headline metric.
- Percentiles are numpy's linear interpolation; ``std`` is the population standard deviation.
"""
from __future__ import annotations

import datetime as _dt
import math
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from . import __version__

SCHEMA_VERSION = "1.4"
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
STAT_KEYS = ("avg", *(f"p{p}" for p in PERCENTILES), "min", "max", "std", "count", "sum")
EXPORT_NAME = "profile_export_mmdatagen.json"
RECORDS_NAME = "records.jsonl"

# Per-request metric tags in export order: tag -> (unit, header for the console table).
RECORD_METRICS: dict[str, tuple[str, str]] = {
    "time_to_first_token": ("ms", "Time to First Token"),
    "request_latency": ("ms", "Request Latency"),
    "inter_token_latency": ("ms", "Inter Token Latency"),
    "output_token_throughput_per_user": ("tokens/sec/user", "Output Token Throughput Per User"),
    "output_sequence_length": ("tokens", "Output Sequence Length"),
    "input_sequence_length": ("tokens", "Input Sequence Length"),
    "num_images": ("images", "Images per Request"),
    "client_added_ttft": ("ms", "Client-added TTFT (client - server)"),
}


@dataclass
class RequestRecord:
    """One request as the client (or the virtual-time simulator) saw it; times in monotonic ns.

    ``end_ns`` is the last content chunk; ``response_end_ns`` the last byte of the response
    (usage chunk, ``[DONE]``), used only for the benchmark window. ``error`` is
    ``{"type", "code", "message"}`` or None for a success.
    """

    conversation_id: str
    turn_index: int
    phase: str  # "warmup" | "profiling"
    start_ns: int
    first_token_ns: int | None
    end_ns: int | None
    output_tokens: int
    input_tokens: int | None
    num_images: int
    error: dict | None
    image_hits: int | None
    image_misses: int | None
    server_ttft_ns: int | None
    x_request_id: str
    streaming: bool = True
    response_end_ns: int | None = None
    predicted_hits: int | None = None
    http_status: int | None = None
    dispatch_index: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_ns is not None

    def values(self) -> dict[str, float]:
        """This request's per-request metric values (ms / tokens / images), AIPerf definitions."""
        out: dict[str, float] = {"num_images": float(self.num_images)}
        if not self.ok:
            return out
        latency_ns = self.end_ns - self.start_ns
        out["request_latency"] = latency_ns / 1e6
        out["output_sequence_length"] = float(self.output_tokens)
        if self.input_tokens is not None:
            out["input_sequence_length"] = float(self.input_tokens)
        if self.streaming and self.first_token_ns is not None:
            ttft_ns = self.first_token_ns - self.start_ns
            out["time_to_first_token"] = ttft_ns / 1e6
            if self.server_ttft_ns is not None:
                out["client_added_ttft"] = (ttft_ns - self.server_ttft_ns) / 1e6
            if self.output_tokens >= 2:
                itl_ns = (latency_ns - ttft_ns) / (self.output_tokens - 1)
                out["inter_token_latency"] = itl_ns / 1e6
                if itl_ns > 0:
                    out["output_token_throughput_per_user"] = 1e9 / itl_ns
        return out


def stats_block(values: Sequence[float], unit: str) -> dict[str, Any]:
    """AIPerf's per-request metric block; all statistics None when there are no values."""
    arr = np.asarray(values, dtype=np.float64)
    block: dict[str, Any] = {"unit": unit}
    if arr.size == 0:
        block.update({k: None for k in STAT_KEYS})
        block["count"] = 0
        return block
    pct = np.percentile(arr, PERCENTILES)  # linear interpolation (numpy default)
    block["avg"] = float(arr.mean())
    for p, v in zip(PERCENTILES, pct):
        block[f"p{p}"] = float(v)
    block.update(min=float(arr.min()), max=float(arr.max()), std=float(arr.std()),
                 count=int(arr.size), sum=float(arr.sum()))
    return block


def _run_block(value: float | int | None, unit: str) -> dict[str, Any]:
    return {"unit": unit, "avg": value}


def _error_summary(records: Iterable[RequestRecord]) -> list[dict]:
    counts: Counter = Counter()
    for r in records:
        if r.error is not None:
            e = r.error
            counts[(e.get("type"), e.get("code"), e.get("message"))] += 1
    return [{"error_details": {"type": t, "code": c, "message": m}, "count": n}
            for (t, c, m), n in counts.most_common()]


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc).isoformat()


def phase_metrics(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """All metric blocks for one phase's records (per-request blocks, then run-level blocks)."""
    per: dict[str, list[float]] = {tag: [] for tag in RECORD_METRICS}
    for r in records:
        for tag, v in r.values().items():
            per[tag].append(v)
    out: dict[str, Any] = {}
    for tag, (unit, _) in RECORD_METRICS.items():
        if tag == "client_added_ttft" and not per[tag]:
            continue
        out[tag] = stats_block(per[tag], unit)
    ok = [r for r in records if r.ok]
    starts = [r.start_ns for r in records]
    ends = [e for r in records if (e := (r.response_end_ns or r.end_ns)) is not None]
    duration_s = (max(ends) - min(starts)) / 1e9 if starts and ends else None
    if duration_s is not None and duration_s <= 0:
        duration_s = None
    total_out = int(sum(r.output_tokens for r in ok))
    total_in = (int(sum(r.input_tokens for r in ok))
                if ok and all(r.input_tokens is not None for r in ok) else None)
    out["request_throughput"] = _run_block(len(ok) / duration_s if duration_s else None,
                                           "requests/sec")
    out["output_token_throughput"] = _run_block(total_out / duration_s if duration_s else None,
                                                "tokens/sec")
    out["benchmark_duration"] = _run_block(duration_s, "sec")
    out["request_count"] = _run_block(len(ok), "requests")
    out["error_request_count"] = _run_block(len(records) - len(ok), "requests")
    out["total_output_tokens"] = _run_block(total_out, "tokens")
    out["total_input_tokens"] = _run_block(total_in, "tokens")
    out["total_osl"] = _run_block(total_out, "tokens")  # AIPerf's names for the same totals
    out["total_isl"] = _run_block(total_in, "tokens")
    out["total_images"] = _run_block(int(sum(r.num_images for r in records)), "images")
    return out


def image_cache_summary(records: Sequence[RequestRecord], *,
                        predicted: dict | None = None,
                        scraped: dict | None = None) -> dict[str, Any]:
    """Measured cache hits (per-request headers), predicted and /metrics-scraped, TTFT split."""
    with_hdr = [r for r in records if r.image_hits is not None and r.image_misses is not None]
    hits = sum(r.image_hits for r in with_hdr)
    misses = sum(r.image_misses for r in with_hdr)
    measured = None
    if with_hdr:
        measured = {"source": "x-mmdatagen-image-hits/misses headers", "requests": len(with_hdr),
                    "hits": hits, "misses": misses,
                    "hit_rate": hits / (hits + misses) if hits + misses else None}
    all_hit, not_all = [], []
    for r in with_hdr:
        v = r.values().get("time_to_first_token")
        if v is None or r.num_images == 0:
            continue
        (all_hit if r.image_misses == 0 else not_all).append(v)
    return {
        "measured": measured,
        "predicted": predicted,
        "server_metrics": scraped,
        "time_to_first_token_all_hit": stats_block(all_hit, "ms"),
        "time_to_first_token_not_all_hit": stats_block(not_all, "ms"),
    }


def build_export(records: Sequence[RequestRecord], *, input_config: dict,
                 run_info: dict | None = None, was_cancelled: bool = False,
                 is_complete: bool | None = None, benchmark_id: str | None = None,
                 wall_offset_ns: int | None = None, predicted: dict | None = None,
                 scraped: dict | None = None,
                 wall_span_ns: tuple[int, int] | None = None) -> dict[str, Any]:
    """The ``profile_export_mmdatagen.json`` document (AIPerf schema 1.4 top level and blocks).

    ``wall_offset_ns`` maps the records' monotonic clock to Unix time for ``start_time`` /
    ``end_time`` (``time.time_ns() - time.perf_counter_ns()`` taken once); None leaves them null.
    ``wall_span_ns`` (Unix ns start, end) overrides both, e.g. when records were rescaled.
    """
    prof = [r for r in records if r.phase == "profiling"]
    warm = [r for r in records if r.phase == "warmup"]
    start_ns = min((r.start_ns for r in records), default=None)
    end_ns = max((e for r in records if (e := (r.response_end_ns or r.end_ns)) is not None),
                 default=None)
    off = wall_offset_ns
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "aiperf_version": f"mmdatagen-{__version__}",
        "mmdatagen_version": __version__,
        "benchmark_id": benchmark_id or str(uuid.uuid4()),
        "start_time": _iso(start_ns + off) if off is not None and start_ns is not None else None,
        "end_time": _iso(end_ns + off) if off is not None and end_ns is not None else None,
        "was_cancelled": bool(was_cancelled),
        "is_complete": (not was_cancelled) if is_complete is None else bool(is_complete),
        "error_summary": _error_summary(prof),
        "input_config": input_config,
        "run_info": run_info or {},
        "warmup_metrics": phase_metrics(warm) if warm else None,
    }
    if wall_span_ns is not None:
        doc["start_time"], doc["end_time"] = _iso(wall_span_ns[0]), _iso(wall_span_ns[1])
    doc["warmup_error_summary"] = _error_summary(warm)
    doc.update(phase_metrics(prof))
    doc["image_cache"] = image_cache_summary(prof, predicted=predicted, scraped=scraped)
    return doc


def record_line(r: RequestRecord) -> dict[str, Any]:
    """One ``records.jsonl`` line in AIPerf's per-request shape (metadata + metrics + error)."""
    meta = {
        "conversation_id": r.conversation_id, "turn_index": r.turn_index,
        "benchmark_phase": r.phase, "x_request_id": r.x_request_id,
        "request_start_ns": r.start_ns, "first_token_ns": r.first_token_ns,
        "request_end_ns": r.end_ns, "response_end_ns": r.response_end_ns,
        "streaming": r.streaming, "http_status": r.http_status,
        "num_images": r.num_images, "output_tokens": r.output_tokens,
        "input_tokens": r.input_tokens, "image_hits": r.image_hits,
        "image_misses": r.image_misses, "server_ttft_ns": r.server_ttft_ns,
        "predicted_hits": r.predicted_hits, "dispatch_index": r.dispatch_index,
    }
    metrics = {tag: {"value": v, "unit": RECORD_METRICS[tag][0]} for tag, v in r.values().items()}
    return {"metadata": meta, "metrics": metrics, "error": r.error}


def write_exports(out_dir: Path, records: Sequence[RequestRecord], export: dict) -> dict[str, Path]:
    """Write ``profile_export_mmdatagen.json`` and ``records.jsonl`` (by start time) atomically."""
    from .errors import UserError
    from .io.atomic import atomic_group

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output folder {out_dir}: {exc.strerror}") from None
    paths = {"export": out_dir / EXPORT_NAME, "records": out_dir / RECORDS_NAME}
    with atomic_group() as open_:  # both files or neither (a full disk leaves the old ones)
        with open_(paths["export"]) as fh:
            fh.write(orjson.dumps(export, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        with open_(paths["records"]) as fh:
            for r in sorted(records, key=lambda r: r.start_ns):
                fh.write(orjson.dumps(record_line(r)))
                fh.write(b"\n")
    return paths


def record_from_dict(d: dict) -> RequestRecord:
    """Rebuild a record from ``dataclasses.asdict`` output (unknown keys ignored)."""
    names = {f.name for f in fields(RequestRecord)}
    return RequestRecord(**{k: v for k, v in d.items() if k in names})


def record_to_dict(r: RequestRecord) -> dict:
    return asdict(r)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "N/A"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.2f}"


def console_table(export: dict) -> str:
    """AIPerf-style console table: per-request metrics with avg/min/max/p99/p90/p50/std."""
    cols = ("avg", "min", "max", "p99", "p90", "p50", "std")
    rows = [("Metric", *cols)]
    for tag, (unit, header) in RECORD_METRICS.items():
        b = export.get(tag)
        if not b or not b.get("count"):
            continue
        rows.append((f"{header} ({unit})", *(_fmt(b.get(c)) for c in cols)))
    run = [("Output Token Throughput (tokens/sec)", "output_token_throughput"),
           ("Request Throughput (requests/sec)", "request_throughput"),
           ("Request Count (requests)", "request_count"),
           ("Error Request Count (requests)", "error_request_count"),
           ("Benchmark Duration (sec)", "benchmark_duration")]
    for label, tag in run:
        b = export.get(tag) or {}
        rows.append((label, _fmt(b.get("avg")), *("" for _ in cols[1:])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    cache = export.get("image_cache") or {}
    extra = []
    meas, pred = cache.get("measured"), cache.get("predicted")
    if meas and meas.get("hit_rate") is not None:
        extra.append(f"Image cache hits (measured, headers): {meas['hits']:,}/"
                     f"{meas['hits'] + meas['misses']:,} = {meas['hit_rate']:.1%}")
    srv = cache.get("server_metrics")
    if srv and srv.get("hit_rate") is not None:
        extra.append(f"Image cache hits (measured, {srv.get('source')}): {srv['hits']:,}/"
                     f"{srv['queries']:,} = {srv['hit_rate']:.1%}")
    if pred and pred.get("hit_rate") is not None:
        extra.append(f"Image cache hits (predicted, {pred.get('model', '?')}, "
                     f"{pred.get('cache_gb', '?')} GiB): {pred['hits']:,}/{pred['references']:,}"
                     f" = {pred['hit_rate']:.1%}")
    elif pred and pred.get("note"):
        extra.append(f"Image cache prediction: {pred['note']}")
    for key, label in (("time_to_first_token_all_hit", "all images hit"),
                       ("time_to_first_token_not_all_hit", "some image missed")):
        b = cache.get(key) or {}
        if b.get("count"):
            extra.append(f"TTFT, {label}: avg {_fmt(b['avg'])} ms, p50 {_fmt(b['p50'])} ms "
                         f"(n={b['count']:,})")
    errs = export.get("error_summary") or []
    for e in errs:
        d = e["error_details"]
        extra.append(f"Error x{e['count']:,}: {d.get('type')} {d.get('code') or ''} "
                     f"{(d.get('message') or '')[:100]}".rstrip())
    if export.get("was_cancelled"):
        extra.append("Run was cancelled: partial results.")
    return "\n".join(lines + ([""] + extra if extra else []))
