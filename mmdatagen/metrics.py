"""Per-request records -> AIPerf-shaped metric blocks (the maths; the export document is built in
``export.py`` and rendered in ``console.py``).

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

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .exportmodel import ErrorCount, ErrorDetails, RunBlock, StatsBlock

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


@dataclass(slots=True)
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
    error: ErrorDetails | None
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
        """This request's per-request metric values (ms / tokens / images), AIPerf definitions
        (:func:`metric_columns` on a one-row table)."""
        return next(metric_rows(RecordTable.from_records([self])))


#: a missing integer in a :class:`RecordTable` column (no real time or count is this)
NONE = np.iinfo(np.int64).min
_INT_FIELDS = ("turn_index", "start_ns", "first_token_ns", "end_ns", "output_tokens",
               "input_tokens", "num_images", "image_hits", "image_misses", "server_ttft_ns",
               "response_end_ns", "predicted_hits", "http_status", "dispatch_index")
_OBJ_FIELDS = ("conversation_id", "phase", "error", "x_request_id")
_FIELD_ORDER = tuple(f.name for f in fields(RequestRecord))


def _int_column(values: list) -> np.ndarray:
    try:
        return np.array(values, np.int64)
    except TypeError:  # None among them
        return np.array([NONE if v is None else v for v in values], np.int64)


def py_values(col: np.ndarray) -> list:
    """A column as Python values, None for :data:`NONE`."""
    if col.dtype != np.int64 or not (missing := col == NONE).any():
        return col.tolist()
    out = col.astype(object)
    out[missing] = None
    return out.tolist()


class RecordTable:
    """Records as columns: each :class:`RequestRecord` field one numpy array (integers int64
    with :data:`NONE` for None, ``streaming`` bool, strings and errors object arrays).

    The export's maths read tables, so a run of a million requests (merge-runs) never holds a
    million objects; a list of records is turned into one by :func:`as_table`.
    """

    def __init__(self, cols: dict[str, np.ndarray]) -> None:
        self.cols = cols

    def __len__(self) -> int:
        return int(self.cols["start_ns"].size)

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["cols"][name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def from_columns(cls, values: dict[str, list]) -> RecordTable:
        """From one list per field (None where missing); an absent field is all default."""
        n = len(values["start_ns"])
        cols: dict[str, np.ndarray] = {}
        for name in _INT_FIELDS:
            v = values.get(name)
            cols[name] = np.full(n, NONE, np.int64) if v is None else _int_column(v)
        for name in _OBJ_FIELDS:
            obj = np.empty(n, object)
            obj[:] = values.get(name, [None] * n)
            cols[name] = obj
        cols["streaming"] = np.array(values.get("streaming", [True] * n), bool)
        return cls(cols)

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord]) -> RecordTable:
        records = list(records)
        return cls.from_columns({name: [getattr(r, name) for r in records]
                                 for name in (*_INT_FIELDS, *_OBJ_FIELDS, "streaming")})

    @classmethod
    def concat(cls, tables: Sequence[RecordTable]) -> RecordTable:
        if not tables:
            return cls.from_columns({"start_ns": []})
        return cls({k: np.concatenate([t.cols[k] for t in tables]) for k in tables[0].cols})

    def take(self, index: np.ndarray) -> RecordTable:
        """The rows ``index`` selects (a boolean mask or positions), in order."""
        return RecordTable({k: v[index] for k, v in self.cols.items()})

    def phase_is(self, phase: str) -> np.ndarray:
        return self.cols["phase"] == phase

    @property
    def has_error(self) -> np.ndarray:
        return ~np.equal(self.cols["error"], None)  # type: ignore[call-overload]

    @property
    def ok(self) -> np.ndarray:
        """Succeeded: no error and a last content chunk (``RequestRecord.ok``)."""
        return ~self.has_error & (self.cols["end_ns"] != NONE)

    def records(self, index: np.ndarray | None = None) -> list[RequestRecord]:
        """The rows (all, or ``index``'s) as :class:`RequestRecord` objects."""
        t = self if index is None else self.take(index)
        return [RequestRecord(*row)
                for row in zip(*(py_values(t.cols[name]) for name in _FIELD_ORDER))]


def as_table(records: Sequence[RequestRecord] | RecordTable) -> RecordTable:
    return records if isinstance(records, RecordTable) else RecordTable.from_records(records)


def metric_columns(t: RecordTable) -> dict[str, np.ndarray]:
    """Every per-request metric of every row (NaN where a row has none): AIPerf's definitions
    (see the module docstring), the one implementation of them."""
    c = t.cols
    start, first, out = c["start_ns"], c["first_token_ns"], c["output_tokens"]
    ok = t.ok
    nan = np.nan
    lat_ns = np.where(ok, c["end_ns"], start) - start
    has_ttft = ok & c["streaming"] & (first != NONE)
    ttft_ns = np.where(has_ttft, first, start) - start
    server = c["server_ttft_ns"]
    has_itl = has_ttft & (out >= 2)
    itl_ns = np.where(has_itl, (lat_ns - ttft_ns) / np.maximum(out - 1, 1), nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        tput = np.where(has_itl & (itl_ns > 0), 1e9 / itl_ns, nan)
    inp = c["input_tokens"]
    return {
        "num_images": c["num_images"].astype(np.float64),
        "request_latency": np.where(ok, lat_ns / 1e6, nan),
        "output_sequence_length": np.where(ok, out.astype(np.float64), nan),
        "input_sequence_length": np.where(ok & (inp != NONE), inp.astype(np.float64), nan),
        "time_to_first_token": np.where(has_ttft, ttft_ns / 1e6, nan),
        "client_added_ttft": np.where(has_ttft & (server != NONE),
                                      (ttft_ns - np.where(server == NONE, 0, server)) / 1e6, nan),
        "inter_token_latency": itl_ns / 1e6,
        "output_token_throughput_per_user": tput,
    }


@dataclass(frozen=True)
class LineBlock:
    """Consecutive rows of ``records.jsonl``: their fields (``cols``, as a
    :class:`RecordTable`'s), every metric (:func:`metric_columns`: NaN where a row has none)
    and the runs of rows that have the same metrics: ``(start, stop, tags)``, the tags of the
    present metrics in :func:`metric_columns`' order (few runs: a success has them all, a
    failure only its image count)."""

    cols: dict[str, np.ndarray]
    metrics: dict[str, np.ndarray]
    runs: list[tuple[int, int, tuple[str, ...]]]


def line_order(records: Records) -> np.ndarray:
    """The rows of ``records.jsonl``: by start time, ties in the given order."""
    return np.argsort(as_table(records).start_ns, kind="stable")


def line_blocks(records: Records, block: int,
                rows: np.ndarray | None = None) -> Iterator[LineBlock]:
    """``records`` (a list or a table) in :func:`line_order` (or the given ``rows``),
    ``block`` rows at a time. What ``records.jsonl`` holds, finished; the writer only
    serialises it."""
    t = as_table(records)
    order = line_order(t) if rows is None else rows
    for lo in range(0, len(order), block):
        part = t.take(order[lo:lo + block])
        metrics = metric_columns(part)
        yield LineBlock(part.cols, metrics, _metric_runs(metrics))


def _metric_runs(metrics: dict[str, np.ndarray]) -> list[tuple[int, int, tuple[str, ...]]]:
    tags = list(metrics)
    has = np.zeros(len(metrics[tags[0]]), np.int64)
    for bit, v in enumerate(metrics.values()):
        has |= (~np.isnan(v)).astype(np.int64) << bit
    cuts = (np.flatnonzero(np.diff(has)) + 1).tolist()
    starts = [0, *cuts]
    return [(a, b, tuple(t for bit, t in enumerate(tags) if kind >> bit & 1))
            for a, b, kind in zip(starts, [*cuts, has.size], has[starts].tolist())]


def metric_rows(t: RecordTable) -> Iterator[dict[str, float]]:
    """Per row, its metric values as ``RequestRecord.values`` gives them (present ones only,
    in :func:`metric_columns`' order)."""
    cols = metric_columns(t)
    tags = list(cols)
    for row in zip(*(v.tolist() for v in cols.values())):
        yield {tag: v for tag, v in zip(tags, row) if v == v}


def stats_block(values: Sequence[float], unit: str) -> StatsBlock:
    """AIPerf's per-request metric block; all statistics None when there are no values."""
    arr = np.asarray(values, dtype=np.float64)
    block: dict[str, Any] = {"unit": unit}  # a StatsBlock once filled
    if arr.size == 0:
        block.update({k: None for k in STAT_KEYS})
        block["count"] = 0
        return block  # type: ignore[return-value]
    pct = np.percentile(arr, PERCENTILES)  # linear interpolation (numpy default)
    block["avg"] = float(arr.mean())
    for p, v in zip(PERCENTILES, pct):
        block[f"p{p}"] = float(v)
    block.update(min=float(arr.min()), max=float(arr.max()), std=float(arr.std()),
                 count=int(arr.size), sum=float(arr.sum()))
    return block  # type: ignore[return-value]


#: where a request's time goes on the server, as vLLM's request histograms split it: before
#: the scheduler (rendering, preprocessing, the hand-over, and the wait for the engine's step
#: under way to end: vLLM's engine takes new requests in between steps), waiting in its queue,
#: scheduled to first token, first to last token
STAGES = ("frontend", "queue", "prefill", "decode")


def stage_block(sums_ms: dict[str, float], requests: int, clock: str) -> dict[str, Any]:
    """The export's ``server_stages``: mean ms per request of each of :data:`STAGES` (and
    their first three summed: the server's own time to first token) from their sums."""
    if requests <= 0:
        return {"available": False, "reason": "no request finished"}
    avg = {k: round(sums_ms[k] / requests, 3) for k in STAGES}
    avg["ttft"] = round(sum(sums_ms[k] for k in STAGES[:3]) / requests, 3)
    return {"available": True, "requests": requests, "avg_ms": avg,
            "note": f"{clock}; includes warmup requests and any other traffic"}


def _run_block(value: float | int | None, unit: str) -> RunBlock:
    return {"unit": unit, "avg": value}


Records = Sequence[RequestRecord] | RecordTable


def error_summary(records: Records) -> list[ErrorCount]:
    t = as_table(records)
    counts: Counter = Counter()
    for e in t.error[t.has_error]:
        counts[(e.get("type"), e.get("code"), e.get("message"))] += 1
    return [{"error_details": {"type": t, "code": c, "message": m}, "count": n}
            for (t, c, m), n in counts.most_common()]


def per_request_blocks(records: Records) -> dict[str, StatsBlock]:
    """One statistics block per per-request metric (client-added TTFT only when measured)."""
    cols = metric_columns(as_table(records))
    per = {tag: v[~np.isnan(v)] for tag, v in cols.items()}
    return {tag: stats_block(per[tag], unit) for tag, (unit, _) in RECORD_METRICS.items()
            if tag != "client_added_ttft" or per[tag].size}


def response_ends(t: RecordTable) -> np.ndarray:
    """Each row's last byte (``response_end_ns``, else ``end_ns``; :data:`NONE` if neither)."""
    resp = t.response_end_ns
    return np.where((resp != NONE) & (resp != 0), resp, t.end_ns)


def phase_duration_s(records: Records) -> float | None:
    """Last response end - first request start, in seconds; None when empty or not positive."""
    t = as_table(records)
    ends = response_ends(t)
    ends = ends[ends != NONE]
    if not len(t) or not ends.size:
        return None
    duration_s = (int(ends.max()) - int(t.start_ns.min())) / 1e9
    return duration_s if duration_s > 0 else None


def run_blocks(records: Records) -> dict[str, RunBlock]:
    """Run-level blocks: throughputs over the phase's duration, counts and totals."""
    t = as_table(records)
    ok = t.ok
    n_ok = int(ok.sum())
    duration_s = phase_duration_s(t)
    total_out = int(t.output_tokens[ok].sum())
    inputs = t.input_tokens[ok]
    total_in = int(inputs.sum()) if n_ok and not (inputs == NONE).any() else None

    def per_second(n: float) -> float | None:
        return n / duration_s if duration_s else None

    return {
        "request_throughput": _run_block(per_second(n_ok), "requests/sec"),
        "output_token_throughput": _run_block(per_second(total_out), "tokens/sec"),
        "benchmark_duration": _run_block(duration_s, "sec"),
        "request_count": _run_block(n_ok, "requests"),
        "error_request_count": _run_block(len(t) - n_ok, "requests"),
        "total_output_tokens": _run_block(total_out, "tokens"),
        "total_input_tokens": _run_block(total_in, "tokens"),
        "total_osl": _run_block(total_out, "tokens"),  # AIPerf's names for the same totals
        "total_isl": _run_block(total_in, "tokens"),
        "total_images": _run_block(int(t.num_images.sum()), "images"),
    }


def phase_metrics(records: Records) -> dict[str, Any]:
    """All metric blocks for one phase's records (per-request blocks, then run-level blocks)."""
    t = as_table(records)
    return {**per_request_blocks(t), **run_blocks(t)}


# The export document and the console table live in export.py and console.py; these names stay
# importable from here.
_MOVED = {"build_export": "export", "image_cache_summary": "export", "record_line": "export",
          "write_exports": "export", "record_from_dict": "export", "record_to_dict": "export",
          "console_table": "console"}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__package__}.{module}"), name)
