"""The export document (``profile_export_mmdatagen.json``) and ``records.jsonl``.

Shared by the loader and the simulator: both produce :class:`~mmdatagen.metrics.RequestRecord`
lists and call :func:`build_export`; the shape is :mod:`mmdatagen.exportmodel`.
"""
from __future__ import annotations

import datetime as _dt
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from . import __version__
from .exportmodel import Export, ExportHeader, ImageCache
from .metrics import (
    EXPORT_NAME,
    NONE,
    RECORD_METRICS,
    RECORDS_NAME,
    SCHEMA_VERSION,
    LineGroup,
    Records,
    RecordTable,
    RequestRecord,
    as_table,
    error_summary,
    line_blocks,
    metric_columns,
    phase_metrics,
    response_ends,
    stats_block,
)
from .outcomes import engine_faults

__all__ = ["EXPORT_NAME", "RECORDS_NAME", "build_export", "image_cache_summary", "record_line",
           "write_exports", "record_from_dict", "record_to_dict"]


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.UTC).isoformat()


def image_cache_summary(records: Records, *, predicted: dict | None = None,
                        scraped: dict | None = None) -> ImageCache:
    """Measured cache hits (per-request headers), predicted and /metrics-scraped, TTFT split."""
    t = as_table(records)
    with_hdr = (t.image_hits != NONE) & (t.image_misses != NONE)
    n_hdr = int(with_hdr.sum())
    hits, misses = int(t.image_hits[with_hdr].sum()), int(t.image_misses[with_hdr].sum())
    measured = None
    if n_hdr:
        measured = {"source": "x-mmdatagen-image-hits/misses headers", "requests": n_hdr,
                    "hits": hits, "misses": misses,
                    "hit_rate": hits / (hits + misses) if hits + misses else None}
    ttft = metric_columns(t)["time_to_first_token"]
    split = with_hdr & ~np.isnan(ttft) & (t.num_images != 0)
    all_hit = ttft[split & (t.image_misses == 0)]
    not_all = ttft[split & (t.image_misses != 0)]
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
    of the target's own family: every request), None when nothing measured them. The band over
    any order (``any_order``, beside a first-come-first-served band) is checked the same way."""
    out = _band_check(band, measured, scraped, band.get("family"))
    if isinstance(band.get("any_order"), dict):
        out["any_order"] = _band_check(band["any_order"], measured, scraped, band.get("family"))
    return out


def _band_check(band: dict, measured: dict | None, scraped: dict | None,
                family: str | None) -> dict:
    if measured is not None:
        value, low, high, what = measured["hits"], band["low"], band["high"], measured["source"]
    elif scraped is not None and family and scraped.get("source") == family:
        whole = band.get("all_requests") or band
        value, low, high, what = scraped["hits"], whole["low"], whole["high"], scraped["source"]
    else:
        return band
    return {**band, "measured": value, "measured_by": what,
            "measured_inside": bool(low <= value <= high)}


def _window(t: RecordTable) -> tuple[int | None, int | None]:
    ends = response_ends(t)
    ends = ends[ends != NONE]
    return (int(t.start_ns.min()) if len(t) else None,
            int(ends.max()) if ends.size else None)


def _times(records: RecordTable, wall_offset_ns: int | None,
           wall_span_ns: tuple[int, int] | None) -> tuple[str | None, str | None]:
    """ISO start and end: an explicit Unix span, else the records' window shifted to Unix time."""
    if wall_span_ns is not None:
        return _iso(wall_span_ns[0]), _iso(wall_span_ns[1])
    if wall_offset_ns is None:
        return None, None
    start, end = _window(records)
    return (None if start is None else _iso(start + wall_offset_ns),
            None if end is None else _iso(end + wall_offset_ns))


def build_export(records: Records, *, input_config: dict,
                 run_info: dict | None = None, was_cancelled: bool = False,
                 is_complete: bool | None = None, benchmark_id: str | None = None,
                 wall_offset_ns: int | None = None, predicted: dict | None = None,
                 scraped: dict | None = None,
                 wall_span_ns: tuple[int, int] | None = None) -> Export:
    """The ``profile_export_mmdatagen.json`` document (AIPerf schema 1.4 top level and blocks).

    ``wall_offset_ns`` maps the records' monotonic clock to Unix time for ``start_time`` /
    ``end_time`` (``time.time_ns() - time.perf_counter_ns()`` taken once); None leaves them null.
    ``wall_span_ns`` (Unix ns start, end) overrides both, e.g. when records were rescaled.
    ``records``: a list of records or a :class:`~mmdatagen.metrics.RecordTable`.
    """
    t = as_table(records)
    prof, warm = t.take(t.phase_is("profiling")), t.take(t.phase_is("warmup"))
    start_time, end_time = _times(t, wall_offset_ns, wall_span_ns)
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
        "warmup_metrics": phase_metrics(warm) if len(warm) else None,
        "warmup_error_summary": error_summary(warm),
    }
    doc: Export = {**header, **phase_metrics(prof)}
    doc["image_cache"] = image_cache_summary(prof, predicted=predicted, scraped=scraped)
    doc["engine_faults"] = engine_faults(t.records(t.has_error))
    return doc


#: ``records.jsonl`` metadata keys and the record fields they hold, in the line's order
LINE_META: tuple[tuple[str, str], ...] = (
    ("conversation_id", "conversation_id"), ("turn_index", "turn_index"),
    ("benchmark_phase", "phase"), ("x_request_id", "x_request_id"),
    ("request_start_ns", "start_ns"), ("first_token_ns", "first_token_ns"),
    ("request_end_ns", "end_ns"), ("response_end_ns", "response_end_ns"),
    ("streaming", "streaming"), ("http_status", "http_status"), ("num_images", "num_images"),
    ("output_tokens", "output_tokens"), ("input_tokens", "input_tokens"),
    ("image_hits", "image_hits"), ("image_misses", "image_misses"),
    ("server_ttft_ns", "server_ttft_ns"), ("predicted_hits", "predicted_hits"),
    ("dispatch_index", "dispatch_index"))
_CHUNK = 1 << 12  # rows a time: small enough that no buffer leaves the heap
_BLOCK_BYTES = 1 << 22
_WRITE_LINES = 64  # lines per write: few system calls, every buffer on the heap


def record_line(r: RequestRecord) -> dict[str, Any]:
    """One ``records.jsonl`` line in AIPerf's per-request shape (metadata + metrics + error)."""
    metrics = {tag: {"value": v, "unit": RECORD_METRICS[tag][0]} for tag, v in r.values().items()}
    return {"metadata": {key: getattr(r, field) for key, field in LINE_META},
            "metrics": metrics, "error": r.error}


def _json_each(col: np.ndarray) -> tuple[list[bytes], bytes]:
    """Each value's JSON as orjson writes it, and the template slot that takes it. One
    ``orjson.dumps`` of the whole column, split where no value can hold the separator: a
    comma between numbers, booleans and nulls; ``","`` between strings (inside a string a
    quote is always escaped), whose quotes stay in the slot. An integer or boolean column is
    written from its array (no Python int per value), :data:`NONE` as null."""
    if col.dtype == np.int64 or col.dtype == bool:
        if not col.size:
            return [], b"%s"
        missing = col == NONE if col.dtype == np.int64 else None
        if missing is not None and missing.all():
            return [b"null"] * col.size, b"%s"
        each = orjson.dumps(np.ascontiguousarray(col), option=orjson.OPT_SERIALIZE_NUMPY
                            )[1:-1].split(b",")
        if missing is not None and missing.any():
            marked = np.array(each, object)
            marked[missing] = b"null"
            each = marked.tolist()
        return each, b"%s"
    values = col.tolist()
    if not values:
        return [], b"%s"
    if col.dtype != object:
        return orjson.dumps(values)[1:-1].split(b","), b"%s"
    types = set(map(type, values))
    if types == {str}:
        return orjson.dumps(values)[2:-2].split(b'","'), b'"%s"'
    if types <= {type(None), int, float, bool}:
        return orjson.dumps(values)[1:-1].split(b","), b"%s"
    return [b"null" if v is None else orjson.dumps(v) for v in values], b"%s"


def _metric_slot(tag: str, first: bool) -> bytes:
    """``"tag":{"value":%s,"unit":U}`` (comma-led unless ``first``): a present metric's slot."""
    head = orjson.dumps(tag) + b':{"value":%s,"unit":'
    return (b"" if first else b",") + head + orjson.dumps(RECORD_METRICS[tag][0]) + b"}"


def _group_lines(group: LineGroup) -> list[bytes]:
    """The lines of rows that all have the same metrics: one template with those metrics' keys
    and units in it, filled with each row's values."""
    cols, slots = zip(*(_json_each(group.cols[field]) for _, field in LINE_META))
    meta = b",".join(orjson.dumps(key) + b":" + slot for (key, _), slot in zip(LINE_META, slots))
    cols += tuple(_json_each(v)[0] for v in group.metrics.values())
    cols += (_json_each(group.cols["error"])[0],)
    template = (b'{"metadata":{' + meta + b'},"metrics":{'
                + b"".join(_metric_slot(tag, i == 0) for i, tag in enumerate(group.metrics))
                + b'},"error":%s}\n')
    return [template % row for row in zip(*cols)]


def _block_lines(size: int, groups: list[LineGroup]) -> list[bytes]:
    """A block's lines in order: each group's from its own template, put back in place."""
    if len(groups) == 1 and groups[0].rows is None:
        return _group_lines(groups[0])
    out = np.empty(size, object)
    for group in groups:
        out[group.rows] = _group_lines(group)
    return out.tolist()


def record_lines(records: Records) -> Iterator[bytes]:
    """The ``records.jsonl`` lines of ``records`` (a list or a table), by start time (ties in
    the given order), in blocks of whole lines: the bytes of ``orjson.dumps(record_line(r))``
    for each, written from whole columns through templates (no dict per line); the blocks
    and their groups are ``metrics.line_blocks``'."""
    for size, groups in line_blocks(records, _CHUNK):
        lines = _block_lines(size, groups)
        for i in range(0, len(lines), _WRITE_LINES):
            yield b"".join(lines[i:i + _WRITE_LINES])


_OURS, _SPLIT = b'{"metadata":{', b'},"metrics":'
_NO_ERROR = (b',"error":null}\n', b',"error":null}')


def _parse_line(line: bytes) -> tuple[dict, Any]:
    """A line's metadata and error. A line as :func:`record_lines` writes it (compact, no
    error) has only its metadata parsed: no string can hold the unescaped quote of the
    separator, and the metadata's values are scalars."""
    if line.startswith(_OURS) and line.endswith(_NO_ERROR):
        i = line.find(_SPLIT)
        if i > 0:
            return orjson.loads(line[12:i + 1]), None
    d = orjson.loads(line)
    return d["metadata"], d.get("error")


def _parse_block(path: Path, first: int, lines: list[bytes]) -> tuple[list[dict], list, list]:
    """The metadata, errors and line numbers of a block of lines (blank lines skipped): our
    own lines without an error have only their metadata parsed (:func:`_parse_line`)."""
    from .errors import DatasetError

    try:
        metas: list = [orjson.loads(line[12:line.find(_SPLIT) + 1])
                       if line.startswith(_OURS) and line.endswith(_NO_ERROR) else None
                       for line in lines]
    except orjson.JSONDecodeError:
        metas = [None] * len(lines)
    if None not in metas:
        return metas, [None] * len(lines), list(range(first, first + len(lines)))
    out, errors, numbers = [], [], []
    for n, line, meta in zip(range(first, first + len(lines)), lines, metas):
        error = None
        if meta is None:
            if not line.strip():
                continue
            try:
                meta, error = _parse_line(line)
                if not isinstance(meta, dict):
                    raise TypeError("metadata is not an object")
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                raise DatasetError(f"{path}:{n}: not a {RECORDS_NAME} line ({exc})") from None
        out.append(meta)
        errors.append(error)
        numbers.append(n)
    return out, errors, numbers


def _table_block(path: Path, metas: list[dict], errors: list, numbers: list) -> RecordTable:
    from .errors import DatasetError

    values: dict[str, Any] = {}
    for key, field in LINE_META:
        try:
            values[field] = [m[key] for m in metas]
        except KeyError:  # a line without it: None
            values[field] = [m.get(key) for m in metas]
    if None in values["start_ns"]:
        n = numbers[values["start_ns"].index(None)]
        raise DatasetError(f"{path}:{n}: not a {RECORDS_NAME} line (no request_start_ns)")
    for field, default in (("streaming", True), ("output_tokens", 0), ("num_images", 0),
                           ("turn_index", 0)):
        if None in values[field]:
            values[field] = [default if v is None else v for v in values[field]]
    for field in ("conversation_id", "phase"):  # one string object per distinct value
        seen: dict = {}
        values[field] = [seen.setdefault(v, v) for v in values[field]]
    values["error"] = errors
    try:
        return RecordTable.from_columns(values)
    except (TypeError, ValueError, OverflowError) as exc:
        raise DatasetError(f"{path}:{numbers[0]}-{numbers[-1]}: a {RECORDS_NAME} field has the "
                           f"wrong type ({exc})") from None


def read_records(path: Path) -> RecordTable:
    """A ``records.jsonl`` as a table (blank lines skipped); a line that is not a record is
    a :class:`~mmdatagen.errors.DatasetError` naming it. Read in blocks: the parsed lines of
    one block at a time, the columns of all."""
    parts: list[RecordTable] = []
    first = 1
    with open(path, "rb") as fh:
        while lines := fh.readlines(_BLOCK_BYTES):
            parts.append(_table_block(path, *_parse_block(path, first, lines)))
            first += len(lines)
    return RecordTable.concat(parts)


def write_exports(out_dir: Path, records: Records, export: dict,
                  extra: dict[str, Iterable[bytes]] | None = None) -> dict[str, Path]:
    """Write ``profile_export_mmdatagen.json`` and ``records.jsonl`` (by start time) atomically,
    with ``extra`` files (name -> lines) in the same group. ``records``: a list or a table."""
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
            fh.writelines(record_lines(records))
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


