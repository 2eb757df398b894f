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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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
        """This request's per-request metric values (ms / tokens / images), AIPerf definitions."""
        out: dict[str, float] = {"num_images": float(self.num_images)}
        if not self.ok:
            return out
        assert self.end_ns is not None  # ok
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


def _run_block(value: float | int | None, unit: str) -> RunBlock:
    return {"unit": unit, "avg": value}


def error_summary(records: Iterable[RequestRecord]) -> list[ErrorCount]:
    counts: Counter = Counter()
    for r in records:
        if r.error is not None:
            e = r.error
            counts[(e.get("type"), e.get("code"), e.get("message"))] += 1
    return [{"error_details": {"type": t, "code": c, "message": m}, "count": n}
            for (t, c, m), n in counts.most_common()]


def per_request_blocks(records: Sequence[RequestRecord]) -> dict[str, StatsBlock]:
    """One statistics block per per-request metric (client-added TTFT only when measured)."""
    per: dict[str, list[float]] = {tag: [] for tag in RECORD_METRICS}
    for r in records:
        for tag, v in r.values().items():
            per[tag].append(v)
    return {tag: stats_block(per[tag], unit) for tag, (unit, _) in RECORD_METRICS.items()
            if tag != "client_added_ttft" or per[tag]}


def phase_duration_s(records: Sequence[RequestRecord]) -> float | None:
    """Last response end - first request start, in seconds; None when empty or not positive."""
    starts = [r.start_ns for r in records]
    ends = [e for r in records if (e := (r.response_end_ns or r.end_ns)) is not None]
    if not starts or not ends:
        return None
    duration_s = (max(ends) - min(starts)) / 1e9
    return duration_s if duration_s > 0 else None


def run_blocks(records: Sequence[RequestRecord]) -> dict[str, RunBlock]:
    """Run-level blocks: throughputs over the phase's duration, counts and totals."""
    ok = [r for r in records if r.ok]
    duration_s = phase_duration_s(records)
    total_out = int(sum(r.output_tokens for r in ok))
    total_in = (int(sum(r.input_tokens for r in ok))  # type: ignore[misc]
                if ok and all(r.input_tokens is not None for r in ok) else None)

    def per_second(n: float) -> float | None:
        return n / duration_s if duration_s else None

    return {
        "request_throughput": _run_block(per_second(len(ok)), "requests/sec"),
        "output_token_throughput": _run_block(per_second(total_out), "tokens/sec"),
        "benchmark_duration": _run_block(duration_s, "sec"),
        "request_count": _run_block(len(ok), "requests"),
        "error_request_count": _run_block(len(records) - len(ok), "requests"),
        "total_output_tokens": _run_block(total_out, "tokens"),
        "total_input_tokens": _run_block(total_in, "tokens"),
        "total_osl": _run_block(total_out, "tokens"),  # AIPerf's names for the same totals
        "total_isl": _run_block(total_in, "tokens"),
        "total_images": _run_block(int(sum(r.num_images for r in records)), "images"),
    }


def phase_metrics(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """All metric blocks for one phase's records (per-request blocks, then run-level blocks)."""
    return {**per_request_blocks(records), **run_blocks(records)}


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
