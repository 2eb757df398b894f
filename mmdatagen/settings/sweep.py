"""``sweep`` specs: the grid (lists), the target, and how ``sweep`` shows the load options.

The load itself is :class:`~mmdatagen.settings.load.Load` (the fields ``bench`` has), minus the ones
a sweep does not take and with the swept ones replaced by the grid's comma lists. Whether a
``--sim-param`` field exists is the simulator profile's business: the loader checks it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import common
from .base import expand, list_option, option, spec
from .cache import SIZE_ALIASES, SIZE_MAX
from .values import LIST_HELP

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


@spec
@dataclass(frozen=True)
class SweepGrid:
    """The swept values: the cartesian product of every list given is the grid. Lists take
    ``settings.values``' one syntax (repeat the flag, comma-separate, or a range)."""

    concurrency: tuple[str, ...] = list_option("--concurrency", "Sessions in flight, e.g. "
                                               "1,8,32,64" + LIST_HELP, int, min=1,
                                               max=1_000_000)
    request_rate: tuple[str, ...] = list_option("--request-rate", "Requests/s (concurrency "
                                                "caps)" + LIST_HELP, float, min=common.MIN_RATE,
                                                max=1e6)
    cache_size: tuple[str, ...] = list_option("--cache-size", "The embedded simulator's cache "
                                              "size, in its target's unit (default: the "
                                              "target's own; simulator only)" + LIST_HELP, float, "SIZE",
                                              max=SIZE_MAX, aliases=SIZE_ALIASES)
    grid_sim_params: tuple[str, ...] = option((), "--sim-param", "Sweep a simulator profile "
                                              "field, e.g. max_running=32,52; repeatable.",
                                              multiple=True, metavar="FIELD=V1,V2",
                                              show_default=False)

    def axes(self) -> dict[str, list[int] | list[float]]:
        """The load axes given, in grid order: ``{"concurrency": [1, 8], ...}`` (the cache
        size's axis keeps its export name, ``cache_gb``)."""
        return {axis: expand(SweepGrid, name, getattr(self, name))
                for name, axis in GRID_AXES.items() if getattr(self, name)}


#: Grid field -> its axis name in sweep.json, sweep.csv and the point folders.
GRID_AXES = {"concurrency": "concurrency", "request_rate": "request_rate",
             "cache_size": "cache_gb"}


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


@spec
@dataclass(frozen=True)
class SweepSearch:
    """``sweep --search rate``: bisect to the highest request rate whose runs meet the
    ``--goodput`` objectives, instead of running a grid."""

    search: str | None = option(None, "--search", "Search instead of a grid: 'rate' finds the "
                                "highest --request-rate whose runs meet the --goodput SLOs "
                                "(each probe run --repeats times).", choices=("rate",))
    search_min: float = option(1.0, "--search-min", "Lowest rate probed, req/s (the search "
                               "reports when even it misses the SLOs).", kind=float,
                               min=common.MIN_RATE, max=1e6)
    search_max: float | None = option(None, "--search-max", "Highest rate probed, req/s "
                                      "(default: double from --search-min until a probe "
                                      "fails).", kind=float, min=common.MIN_RATE, max=1e6)
    search_precision: float = option(0.05, "--search-precision", "Relative precision: stop "
                                     "when the lowest failing rate is at most (1 + this) x the "
                                     "highest passing one.", kind=float, min=0.001, max=1.0)
    slo_attainment: float = option(0.9, "--slo-attainment", "Share of a run's profiling "
                                   "requests that must be good (succeeded and met every "
                                   "--goodput SLO) for its probe to pass; the mean over the "
                                   "repeats decides.", kind=float, min=0, min_open=True, max=1.0)
