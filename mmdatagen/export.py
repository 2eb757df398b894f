"""The export document (``profile_export_mmdatagen.json``) and ``records.jsonl``.

Shared by the loader and the simulator: both produce :class:`~mmdatagen.metrics.RequestRecord`
lists and call :func:`build_export`; the shape is :mod:`mmdatagen.exportmodel`.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import operator
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, Any

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
    LineBlock,
    Records,
    RecordTable,
    RequestRecord,
    as_table,
    error_summary,
    line_blocks,
    line_order,
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
_META_ROW = operator.itemgetter(*(key for key, _ in LINE_META))
_CHUNK = 1 << 12  # rows a time: small enough that no buffer leaves the heap
_BLOCK_BYTES = 1 << 17  # lines a time: their parsed metadata stays in the cache
_WRITE_LINES = 64  # lines per write: few system calls, every buffer on the heap


def record_line(r: RequestRecord) -> dict[str, Any]:
    """One ``records.jsonl`` line in AIPerf's per-request shape (metadata + metrics + error)."""
    metrics = {tag: {"value": v, "unit": RECORD_METRICS[tag][0]} for tag, v in r.values().items()}
    return {"metadata": {key: getattr(r, field) for key, field in LINE_META},
            "metrics": metrics, "error": r.error}


def _json_each(col: np.ndarray) -> tuple[list[bytes] | None, bytes]:
    """Each value's JSON as orjson writes it, from one ``orjson.dumps`` of the whole column
    split where no value can hold the separator (a comma between numbers, booleans and nulls;
    ``","`` between strings: inside a string a quote is always escaped), and the quote that
    goes around each (strings: ``"``). A column of one integer, boolean, string or null has
    no values (None) and its one value's JSON instead."""
    if not col.size:
        return [], b""
    if col.dtype == object:
        return _json_objects(col.tolist())
    if col.dtype != np.float64 and col.min() == col.max():  # one value (never -0.0 and 0.0)
        return None, _json_array(col[:1])[0]
    return _json_array(col), b""


def _json_array(col: np.ndarray) -> list[bytes]:
    """The values of an integer, boolean or float column written from the array (no Python
    number per value; a float's text is its Python float's), :data:`NONE` and NaN as null."""
    each = orjson.dumps(np.ascontiguousarray(col), option=orjson.OPT_SERIALIZE_NUMPY
                        )[1:-1].split(b",")
    if col.dtype == np.int64 and (missing := col == NONE).any():
        marked = np.array(each, object)
        marked[missing] = b"null"
        each = marked.tolist()
    return each


def _json_objects(values: list) -> tuple[list[bytes] | None, bytes]:
    """:func:`_json_each` of an object column's values (strings, errors, Python numbers)."""
    types = set(map(type, values))
    if types == {str}:
        if values.count(values[0]) == len(values):
            return None, orjson.dumps(values[0])
        return orjson.dumps(values)[2:-2].split(b'","'), b'"'
    if types == {type(None)}:
        return None, b"null"
    if types <= {type(None), int, float, bool}:
        return orjson.dumps(values)[1:-1].split(b","), b""
    return [b"null" if v is None else orjson.dumps(v) for v in values], b""


#: a line's pieces: the bytes between values, and the columns of values between them
_Pieces = tuple[list[bytes], list[list[bytes]]]


def _line_pieces(fields: list[tuple[list[bytes] | None, bytes]],
                 metrics: dict[str, list[bytes]], tags: tuple[str, ...]) -> _Pieces:
    """The constant bytes and the value columns of lines with the metrics ``tags``, in the
    order of ``orjson.dumps(record_line(r))``: ``fields`` are :data:`LINE_META`'s then the
    error, each :func:`_json_each`'s; a field of one value is written in the constants."""
    consts: list[bytes] = []
    values: list[list[bytes]] = []
    text = b'{"metadata":{'

    def put(each: list[bytes] | None, quote: bytes) -> None:
        nonlocal text
        if each is None:
            text += quote
            return
        consts.append(text + quote)
        values.append(each)
        text = quote

    for i, ((key, _), (each, quote)) in enumerate(zip(LINE_META, fields)):
        text += (b"," if i else b"") + orjson.dumps(key) + b":"
        put(each, quote)
    text += b'},"metrics":{'
    for i, tag in enumerate(tags):
        text += (b"," if i else b"") + orjson.dumps(tag) + b':{"value":'
        put(metrics[tag], b"")
        text += b',"unit":' + orjson.dumps(RECORD_METRICS[tag][0]) + b"}"
    text += b'},"error":'
    put(*fields[-1])
    consts.append(text + b"}\n")
    return consts, values


def _run_bytes(pieces: _Pieces, start: int, stop: int) -> Iterator[bytes]:
    """Lines ``start`` to ``stop`` of a block from their pieces, :data:`_WRITE_LINES` lines
    a time: every piece in one list (constants and values interleaved), joined."""
    consts, values = pieces
    n, step = stop - start, len(consts) + len(values)
    flat = [b""] * (n * step)
    flat[0::step] = [consts[0]] * n
    for j, (each, after) in enumerate(zip(values, consts[1:])):
        flat[2 * j + 1::step] = each[start:stop]
        flat[2 * j + 2::step] = [after] * n
    size = _WRITE_LINES * step
    for i in range(0, len(flat), size):
        yield b"".join(flat[i:i + size])


def _block_bytes(block: LineBlock) -> Iterator[bytes]:
    """A block's lines, run by run (rows of the same metrics share their pieces)."""
    fields = [_json_each(block.cols[field]) for _, field in LINE_META]
    fields.append(_json_each(block.cols["error"]))
    metrics = {tag: _json_array(v) for tag, v in block.metrics.items()}
    pieces: dict[tuple[str, ...], _Pieces] = {}
    for start, stop, tags in block.runs:
        if tags not in pieces:
            pieces[tags] = _line_pieces(fields, metrics, tags)
        yield from _run_bytes(pieces[tags], start, stop)


def record_lines(records: Records, rows: np.ndarray | None = None) -> Iterator[bytes]:
    """The ``records.jsonl`` lines of ``records`` (a list or a table), by start time (ties in
    the given order; or the ``rows`` given), in blocks of whole lines: the bytes of
    ``orjson.dumps(record_line(r))`` for each, written from whole columns (no dict per line);
    the blocks and their runs are ``metrics.line_blocks``'."""
    for block in line_blocks(records, _CHUNK, rows):
        yield from _block_bytes(block)


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

    try:  # one C call a line, then the rows turned into columns
        columns = list(zip(*map(_META_ROW, metas))) if metas else [()] * len(LINE_META)
    except KeyError:  # a line without some key: None there
        columns = [tuple(m.get(key) for m in metas) for key, _ in LINE_META]
    values: dict[str, Any] = {field: list(col) for (_, field), col in zip(LINE_META, columns)}
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


#: what forked writers serialise, set before they are forked (nothing is pickled): the table,
#: its lines' order, where its parts begin, which part each end has reached (shared)
_FORKED: dict[str, Any] = {}
_PART_ROWS = 1 << 16  # lines a part: what one process writes at a time


def _claim(last: bool) -> int | None:
    """The next part nobody has taken, from the last (a forked writer) or the first (the
    parent); None once the two ends have met."""
    ends = _FORKED["ends"]  # [the parent's next part, the last part a writer took]
    with ends.get_lock():
        if ends[0] >= ends[1]:
            return None
        if last:
            ends[1] -= 1
            return int(ends[1])
        ends[0] += 1
        return int(ends[0]) - 1


def _part_lines(k: int) -> Iterator[bytes]:
    cuts = _FORKED["cuts"]
    return record_lines(_FORKED["table"], _FORKED["order"][cuts[k]:cuts[k + 1]])


def _write_parts(paths: list[str]) -> None:
    """A forked writer: parts from the last, part ``k`` into ``paths[k]``, until it meets
    the parent."""
    while (k := _claim(last=True)) is not None:
        with open(paths[k], "wb") as fh:
            fh.writelines(_part_lines(k))


def _append(fh: IO[bytes], path: str) -> None:
    """The bytes of ``path`` after ``fh``'s, copied by the kernel where it can."""
    fh.flush()
    with open(path, "rb") as src:
        left = os.fstat(src.fileno()).st_size
        try:
            while left > 0 and (n := os.copy_file_range(src.fileno(), fh.fileno(), left)):
                left -= n
        except OSError as exc:  # no in-kernel copy between these files: the rest by reads
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
        shutil.copyfileobj(src, fh, 1 << 20)
    fh.seek(0, os.SEEK_END)  # the buffered writer learns where the kernel left the file


@contextlib.contextmanager
def records_writer(fh: IO[bytes], records: Records, folder: Path,
                   processes: int = 1) -> Iterator[None]:
    """``records.jsonl``'s lines into ``fh`` (a file in ``folder``), done when the ``with``
    block ends. With ``processes`` > 1, forked writers start at once on its parts from the
    last (each into a temporary file in ``folder``) while the block runs; then this process
    writes parts from the first until it meets them, and appends theirs in order: the same
    bytes, both cores busy to the end."""
    import multiprocessing

    from .io.atomic import hidden_temp
    from .lifecycle import start_workers

    t = as_table(records)
    cuts = [*range(0, len(t), _PART_ROWS), len(t)]
    if processes <= 1 or len(cuts) < 3:
        yield
        fh.writelines(record_lines(t))
        return
    parts = len(cuts) - 1
    paths: list[str] = []
    _FORKED.update(table=t, order=line_order(t), cuts=cuts,
                   ends=multiprocessing.Array("q", [0, parts]))
    try:
        for _ in range(parts):
            fd, path = hidden_temp(folder / RECORDS_NAME)
            os.close(fd)
            paths.append(path)
        with start_workers(processes - 1) as pool:
            writers = [pool.submit(_write_parts, paths) for _ in range(processes - 1)]
            yield
            first = 0  # the parts before it are this process's
            while (k := _claim(last=False)) is not None:
                fh.writelines(_part_lines(k))
                first = k + 1
            for writer in writers:
                writer.result()
            for path in paths[first:]:
                _append(fh, path)
    finally:
        _FORKED.clear()
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)


def write_exports(out_dir: Path, records: Records, export: dict | Callable[[], dict],
                  extra: dict[str, Iterable[bytes]] | None = None,
                  processes: int = 1) -> dict[str, Path]:
    """Write ``profile_export_mmdatagen.json`` and ``records.jsonl`` (by start time) atomically,
    with ``extra`` files (name -> lines) in the same group. ``records``: a list or a table;
    ``export``: the document, or what makes it (called while ``processes`` serialise the
    records: :func:`records_writer`)."""
    from .errors import UserError
    from .io.atomic import atomic_group

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output folder {out_dir}: {exc.strerror}") from None
    paths = {"export": out_dir / EXPORT_NAME, "records": out_dir / RECORDS_NAME}
    with atomic_group() as open_:  # both files or neither (a full disk leaves the old ones)
        with open_(paths["export"]) as fh, open_(paths["records"]) as records_fh:
            with records_writer(records_fh, records, out_dir, processes):
                doc = export() if callable(export) else export
                fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2
                                      | orjson.OPT_SERIALIZE_NUMPY))
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


