"""``sweep`` specs: the grid (comma lists), the target, and how ``sweep`` shows the load options.

The load itself is :class:`~mmdatagen.spec.load.Load` (the fields ``bench`` has), minus the ones
a sweep does not take and with the swept ones replaced by the grid's comma lists. Whether a
``--sim-param`` field exists is the simulator profile's business: the loader checks it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..errors import SpecError
from . import common
from .base import option, spec

#: Load fields a sweep does not take: the swept ones (the grid has them as lists) and the ones
#: its runs leave at their defaults.
LOAD_SKIP = ("concurrency", "request_rate", "fixed_schedule", "benchmark_duration",
             "max_response_mb", "grace_period")
#: Load fields whose help says something else in a sweep.
LOAD_HELP = {
    "input_file": "AIPerf custom dataset JSONL (.gz accepted): the one dataset of every point.",
    "request_count": "Profiling requests per run (default: one pass over the dataset).",
    "extra_inputs": "KEY:VALUE merged into every body.",
    "profile": "Simulator profile (no --url).",
    "seed": "Repeat k uses seed + k - 1 (arrivals, random_pool draws).",
    "quiet": "No progress lines and no table.",
}
#: The embedded simulator's cache (GiB) where the grid does not sweep it.
BASE_CACHE_GB = 10.0

N = TypeVar("N", int, float)


@spec
@dataclass(frozen=True)
class SweepGrid:
    """The swept values: the cartesian product of every list given is the grid."""

    grid_concurrency: str | None = option(None, "--concurrency", "Comma list, e.g. 1,8,32,64.")
    grid_request_rate: str | None = option(None, "--request-rate", "Comma list of requests/s "
                                           "(concurrency caps).")
    grid_cache_gb: str | None = option(None, "--cache-gb", "Comma list of simulator "
                                       "embedding-cache GiB (default 10; simulator only).")
    grid_sim_params: tuple[str, ...] = option((), "--sim-param", "Sweep a simulator profile "
                                              "field, e.g. max_running=32,52; repeatable.",
                                              multiple=True, metavar="FIELD=V1,V2",
                                              show_default=False)

    def check(self) -> None:
        self.axes()

    def axes(self) -> dict[str, list[int] | list[float]]:
        """The load axes given, in grid order: ``{"concurrency": [1, 8], ...}``."""
        out: dict[str, list[int] | list[float]] = {}
        if self.grid_concurrency:
            out["concurrency"] = _numbers("grid_concurrency", self.grid_concurrency, int,
                                          lambda v: 1 <= v <= 1_000_000,
                                          "must be at least 1 (and at most 1000000)")
        if self.grid_request_rate:
            out["request_rate"] = _numbers("grid_request_rate", self.grid_request_rate, float,
                                           lambda v: common.MIN_RATE <= v <= 1e6,
                                           f"must be in [{common.MIN_RATE:g}, 1e6]")
        if self.grid_cache_gb:
            out["cache_gb"] = _numbers("grid_cache_gb", self.grid_cache_gb, float,
                                       lambda v: 0 <= v <= 1e9, "must be in [0, 1e9]")
        return out


def _numbers(name: str, text: str, cast: Callable[[str], N], ok: Callable[[N], bool],
             bound: str) -> list[N]:
    """A comma list of distinct numbers, each within its bound."""
    try:
        vals = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(name, f"takes comma-separated numbers, got {text!r}") from None
    if not vals:
        raise SpecError(name, "needs at least one value")
    if len(set(vals)) != len(vals):
        raise SpecError(name, f"repeats a value: {text}")
    if not all(ok(v) for v in vals):
        raise SpecError(name, f"values {bound}")
    return vals


@spec
@dataclass(frozen=True)
class SweepTarget:
    """Where a sweep's requests go, and where its results land."""

    url: str | None = option(None, "--url", "Your server. Omit to run the embedded simulator, a "
                             "FRESH server per run (every run starts with a cold cache). With "
                             "--url the server is used as it is: its cache is not reset between "
                             "runs.")
    virtual: bool = option(False, "--virtual", "Run the simulator's model in virtual time (as "
                           "'mmdatagen simulate'; a fresh engine, cold cache, per run): seconds "
                           "instead of minutes.", is_flag=True)
    output_dir: Path = option(Path("artifacts/sweep"), "--output-dir", "sweep.json, sweep.csv, "
                              "report.html and <point>/r<k>/.", kind=Path)
    force: bool = option(False, "--force", "Run every point again in a folder of another sweep "
                         "(other dataset or settings); without it such a folder is refused and "
                         "a matching one is resumed.", short="-f", is_flag=True)
