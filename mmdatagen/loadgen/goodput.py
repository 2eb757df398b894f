"""Goodput: requests per second that meet every service-level objective (SLO) given.

The definition is the one vLLM's ``vllm bench serve --goodput`` and AIPerf's ``--goodput`` use:

- a request is *good* when it succeeded and each named per-request metric is within its
  objective (value <= objective; for a larger-is-better metric such as the per-user output token
  throughput, value >= objective). A request lacking a named metric (e.g. no TTFT because the run
  was not streamed, or no ITL with a single output token) is not good, as in AIPerf
  (``aiperf/metrics/types/good_request_count_metric.py``: a missing value fails the request);
- ``good_request_count`` counts good profiling requests; ``goodput = good_request_count /
  benchmark_duration`` in requests per second (``aiperf/metrics/types/goodput_metric.py``;
  vLLM: ``request_goodput = good_completed / dur_s`` in ``vllm/benchmarks/serve.py``).

Objectives are given as ``NAME:VALUE`` in the metric's own unit (ms for latencies). Names: vLLM's
short ones (``ttft``, ``tpot``, ``itl``, ``e2el``) or AIPerf's metric tags
(``time_to_first_token``, ``inter_token_latency``, ``request_latency``,
``output_token_throughput_per_user``). vLLM's ``tpot`` is the per-request mean inter-token time,
which is what AIPerf (and mmdatagen) call ``inter_token_latency``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecError
from ..exportmodel import Export
from ..metrics import Records, as_table, metric_columns

# accepted name -> export tag
ALIASES: dict[str, str] = {
    "ttft": "time_to_first_token",
    "time_to_first_token": "time_to_first_token",
    "tpot": "inter_token_latency",
    "itl": "inter_token_latency",
    "inter_token_latency": "inter_token_latency",
    "e2el": "request_latency",
    "latency": "request_latency",
    "request_latency": "request_latency",
    "output_token_throughput_per_user": "output_token_throughput_per_user",
}
LARGER_IS_BETTER = frozenset({"output_token_throughput_per_user"})


def parse_slos(specs: Iterable[str] | str | None) -> dict[str, float]:
    """``["ttft:300", "itl:20"]`` (or one space-separated string) -> ``{tag: objective}``."""
    if specs is None:
        return {}
    if isinstance(specs, str):
        specs = [specs]
    out: dict[str, float] = {}
    for spec in specs:
        for item in str(spec).replace(",", " ").split():
            name, sep, value = item.partition(":")
            tag = ALIASES.get(name.strip().lower())
            if not sep or tag is None:
                raise SpecError("goodput", f"takes NAME:VALUE with NAME one of "
                                f"{', '.join(sorted(ALIASES))}; got {item!r}")
            try:
                v = float(value)
            except ValueError:
                raise SpecError("goodput", f"{name}: {value!r} is not a number") from None
            if not (v > 0 and math.isfinite(v)):
                raise SpecError("goodput", f"{name}: the objective must be a positive finite "
                                "number of milliseconds")
            out[tag] = v
    return out


def good_mask(values: dict[str, np.ndarray], slos: dict[str, float]) -> np.ndarray:
    """Per row, whether its metric values (NaN: missing, never good) meet every objective."""
    n = len(next(iter(values.values()))) if values else 0
    good = np.ones(n, bool)
    for tag, objective in slos.items():
        v = values.get(tag)
        if v is None:
            return np.zeros(n, bool)
        good &= (v >= objective) if tag in LARGER_IS_BETTER else (v <= objective)
    return good


def is_good(values: dict[str, float], slos: dict[str, float]) -> bool:
    """Whether one successful request's metric values meet every objective."""
    row = {tag: np.array([values.get(tag, np.nan)], np.float64) for tag in slos}
    return bool(good_mask(row, slos)[0])


def good_count(value_rows: Iterable[dict[str, float] | None], slos: dict[str, float]) -> int:
    """Good requests among per-request value dicts (None = a failed request, never good)."""
    return sum(1 for v in value_rows if v is not None and is_good(v, slos))


def goodput_blocks(good: int, duration_s: float | None, slos: dict[str, float]) -> dict[str, Any]:
    """The export's ``goodput`` and ``good_request_count`` blocks (AIPerf's tags and units)."""
    return {
        "goodput": {"unit": "requests/sec", "avg": good / duration_s if duration_s else None,
                    "slos": dict(slos)},
        "good_request_count": {"unit": "requests", "avg": int(good)},
    }


def table_good_count(records: Records, slos: dict[str, float]) -> int:
    """Good profiling requests among ``records`` (a list or a table)."""
    t = as_table(records)
    prof = t.phase_is("profiling") & t.ok
    return int((good_mask(metric_columns(t), slos) & prof).sum())


def export_goodput(records: Records, export: Export, slos: dict[str, float]) -> dict[str, Any]:
    """Goodput blocks for the profiling records of a run whose export is already built."""
    duration = (export.get("benchmark_duration") or {}).get("avg")
    return goodput_blocks(table_good_count(records, slos), duration, slos)


def goodput_from_records_file(path: str | Path, export: Export, slos: dict[str, float]
                              ) -> dict[str, Any] | None:
    """Goodput from a ``records.jsonl`` (ours) beside an export; None when there is none."""
    from ..export import read_records

    path = Path(path)
    if not path.is_file():
        return None
    duration = (export.get("benchmark_duration") or {}).get("avg")
    return goodput_blocks(table_good_count(read_records(path), slos), duration, slos)
