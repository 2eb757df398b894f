"""The export document (``profile_export_mmdatagen.json``) and ``records.jsonl``.

Shared by the loader and the simulator: both produce :class:`~mmdatagen.metrics.RequestRecord`
lists and call :func:`build_export`; the shape is :mod:`mmdatagen.exportmodel`.
"""
from __future__ import annotations

import datetime as _dt
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import orjson

from . import __version__
from .exportmodel import Export, ExportHeader, ImageCache
from .metrics import (
    EXPORT_NAME,
    RECORD_METRICS,
    RECORDS_NAME,
    SCHEMA_VERSION,
    RequestRecord,
    error_summary,
    phase_metrics,
    stats_block,
)
from .outcomes import engine_faults

__all__ = ["EXPORT_NAME", "RECORDS_NAME", "build_export", "image_cache_summary", "record_line",
           "write_exports", "record_from_dict", "record_to_dict"]


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.UTC).isoformat()


def image_cache_summary(records: Sequence[RequestRecord], *,
                        predicted: dict | None = None,
                        scraped: dict | None = None) -> ImageCache:
    """Measured cache hits (per-request headers), predicted and /metrics-scraped, TTFT split."""
    with_hdr = [r for r in records if r.image_hits is not None and r.image_misses is not None]
    hits = sum(r.image_hits or 0 for r in with_hdr)
    misses = sum(r.image_misses or 0 for r in with_hdr)
    measured = None
    if with_hdr:
        measured = {"source": "x-mmdatagen-image-hits/misses headers", "requests": len(with_hdr),
                    "hits": hits, "misses": misses,
                    "hit_rate": hits / (hits + misses) if hits + misses else None}
    all_hit: list[float] = []
    not_all: list[float] = []
    for r in with_hdr:
        v = r.values().get("time_to_first_token")
        if v is None or r.num_images == 0:
            continue
        (all_hit if r.image_misses == 0 else not_all).append(v)
    if predicted is not None and isinstance(predicted.get("band"), dict):
        predicted = {**predicted, "band": band_check(predicted["band"], measured, scraped)}
    return {
        "measured": measured,
        "predicted": predicted,
        "server_metrics": scraped,
        "time_to_first_token_all_hit": stats_block(all_hit, "ms"),
        "time_to_first_token_not_all_hit": stats_block(not_all, "ms"),
    }


def band_check(band: dict, measured: dict | None, scraped: dict | None) -> dict:
    """The order band with ``measured_inside``: the measured hits against the band of the
    requests they cover (the response headers: the profiling requests; the server's counters
    of the target's own family: every request), None when nothing measured them."""
    if measured is not None:
        value, low, high, what = measured["hits"], band["low"], band["high"], measured["source"]
    elif scraped is not None and band.get("family") and scraped.get("source") == band["family"]:
        whole = band.get("all_requests") or band
        value, low, high, what = scraped["hits"], whole["low"], whole["high"], scraped["source"]
    else:
        return band
    return {**band, "measured": value, "measured_by": what,
            "measured_inside": bool(low <= value <= high)}


def _window(records: Sequence[RequestRecord]) -> tuple[int | None, int | None]:
    start = min((r.start_ns for r in records), default=None)
    end = max((e for r in records if (e := (r.response_end_ns or r.end_ns)) is not None),
              default=None)
    return start, end


def _times(records: Sequence[RequestRecord], wall_offset_ns: int | None,
           wall_span_ns: tuple[int, int] | None) -> tuple[str | None, str | None]:
    """ISO start and end: an explicit Unix span, else the records' window shifted to Unix time."""
    if wall_span_ns is not None:
        return _iso(wall_span_ns[0]), _iso(wall_span_ns[1])
    if wall_offset_ns is None:
        return None, None
    start, end = _window(records)
    return (None if start is None else _iso(start + wall_offset_ns),
            None if end is None else _iso(end + wall_offset_ns))


def build_export(records: Sequence[RequestRecord], *, input_config: dict,
                 run_info: dict | None = None, was_cancelled: bool = False,
                 is_complete: bool | None = None, benchmark_id: str | None = None,
                 wall_offset_ns: int | None = None, predicted: dict | None = None,
                 scraped: dict | None = None,
                 wall_span_ns: tuple[int, int] | None = None) -> Export:
    """The ``profile_export_mmdatagen.json`` document (AIPerf schema 1.4 top level and blocks).

    ``wall_offset_ns`` maps the records' monotonic clock to Unix time for ``start_time`` /
    ``end_time`` (``time.time_ns() - time.perf_counter_ns()`` taken once); None leaves them null.
    ``wall_span_ns`` (Unix ns start, end) overrides both, e.g. when records were rescaled.
    """
    prof = [r for r in records if r.phase == "profiling"]
    warm = [r for r in records if r.phase == "warmup"]
    start_time, end_time = _times(records, wall_offset_ns, wall_span_ns)
    header: ExportHeader = {
        "schema_version": SCHEMA_VERSION,
        "aiperf_version": f"mmdatagen-{__version__}",
        "mmdatagen_version": __version__,
        "benchmark_id": benchmark_id or str(uuid.uuid4()),
        "start_time": start_time,
        "end_time": end_time,
        "was_cancelled": bool(was_cancelled),
        "is_complete": (not was_cancelled) if is_complete is None else bool(is_complete),
        "error_summary": error_summary(prof),
        "input_config": input_config,
        "run_info": run_info or {},
        "warmup_metrics": phase_metrics(warm) if warm else None,
        "warmup_error_summary": error_summary(warm),
    }
    doc: Export = {**header, **phase_metrics(prof)}
    doc["image_cache"] = image_cache_summary(prof, predicted=predicted, scraped=scraped)
    doc["engine_faults"] = engine_faults(records)
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


def write_exports(out_dir: Path, records: Sequence[RequestRecord], export: dict,
                  extra: dict[str, Iterable[bytes]] | None = None) -> dict[str, Path]:
    """Write ``profile_export_mmdatagen.json`` and ``records.jsonl`` (by start time) atomically,
    with ``extra`` files (name -> lines) in the same group."""
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
        for name, lines in (extra or {}).items():
            paths[name] = out_dir / name
            with open_(paths[name]) as fh:
                fh.writelines(lines)
    return paths


def record_from_dict(d: dict) -> RequestRecord:
    """Rebuild a record from ``dataclasses.asdict`` output (unknown keys ignored)."""
    names = {f.name for f in fields(RequestRecord)}
    return RequestRecord(**{k: v for k, v in d.items() if k in names})


def record_to_dict(r: RequestRecord) -> dict:
    return asdict(r)


