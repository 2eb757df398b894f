"""The typed shape of ``profile_export_mmdatagen.json`` (AIPerf schema 1.4 top level and blocks)
and of ``sweep.json``.

TypedDicts: the export stays a plain JSON document, and the type checker knows its keys. Metric
blocks sit at the top level under their tag (``time_to_first_token``, ``request_count`` ...).
"""
from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class StatsBlock(TypedDict, total=False):
    """A per-request metric's statistics (all None, count 0, when there are no values)."""

    unit: str
    avg: float | None
    p1: float | None
    p5: float | None
    p10: float | None
    p25: float | None
    p50: float | None
    p75: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    min: float | None
    max: float | None
    std: float | None
    count: int
    sum: float | None


class RunBlock(TypedDict):
    """A run-level value (throughput, count, duration, total)."""

    unit: str
    avg: float | int | None


class ErrorDetails(TypedDict):
    type: str | None
    code: int | str | None
    message: str | None


class ErrorCount(TypedDict):
    error_details: ErrorDetails
    count: int


class ImageCache(TypedDict):
    """Cache evidence: per-request headers, the prediction, /metrics counters, TTFT split."""

    measured: dict[str, Any] | None
    predicted: dict[str, Any] | None
    server_metrics: dict[str, Any] | None
    time_to_first_token_all_hit: StatsBlock
    time_to_first_token_not_all_hit: StatsBlock


class ExportHeader(TypedDict):
    """The top-level keys other than the metric blocks."""

    schema_version: str
    aiperf_version: str
    mmdatagen_version: str
    benchmark_id: str
    start_time: str | None
    end_time: str | None
    was_cancelled: bool
    is_complete: bool
    error_summary: list[ErrorCount]
    input_config: dict[str, Any]
    run_info: dict[str, Any]
    warmup_metrics: dict[str, Any] | None
    warmup_error_summary: list[ErrorCount]


#: The whole document: the header, the metric blocks by tag, and ``image_cache``.
Export = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# sweep.json (mmdatagen sweep): written by loadgen.sweep, read by the report

#: A grid value: a load parameter's number, or a profile field's value (``key_mode=bytes``).
GridValue = int | float | str


class Summary(TypedDict):
    """One metric over a sweep point's repeats: mean, sample std, spread, Student-t 95 % CI
    (None where there are too few values)."""

    n: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    ci95_low: float | None
    ci95_high: float | None
    ci95_half: float | None


class SweepPoint(TypedDict):
    """One grid point: its parameters, each repeat's row (metric name -> value, plus
    ``repeat``, ``dir``, ``resumed``, ``seed``) and each metric's summary over the repeats."""

    name: str
    params: dict[str, GridValue]
    runs: list[dict[str, Any]]
    summary: dict[str, Summary]


class SweepDoc(TypedDict):
    mmdatagen_version: str
    dataset: str
    target: str
    grid: dict[str, list[GridValue]]
    repeats: int
    goodput_slos: dict[str, float] | None
    statistics: str
    base_config: dict[str, Any]
    points: list[SweepPoint]
    search: NotRequired[dict[str, Any]]  # sweep --search rate: the probes and the result
