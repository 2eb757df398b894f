"""Load-generator specs: ``bench`` and ``ab`` (the dataset, the load, the target)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from ..arrivals import Arrival
from . import common
from .base import SpecError, option, spec
from .values import check_labels

DatasetType = Literal["auto", "single_turn", "multi_turn", "random_pool"]
EndpointType = Literal["chat", "completions"]
HttpClient = Literal["raw", "aiohttp"]

#: ab reproduces seed A's benchmark unless told otherwise.
SEED_A_EXTRA = ("max_tokens:150", "min_tokens:150", "ignore_eos:true")
AB_DEFAULTS = {"concurrency": None, "warmup_request_count": 3, "extra_inputs": SEED_A_EXTRA}


@spec
@dataclass(frozen=True)
class Load(common.ExtraInputs):
    """What ``bench`` and ``ab`` send, how fast, and how a run ends."""

    input_file: Path = option(None, "--input-file", "AIPerf custom dataset JSONL (.gz accepted).",
                              kind=Path, required=True, show_default=False)
    dataset_type: DatasetType = option("auto", "--custom-dataset-type", "Dataset format; auto "
                                       "tells single_turn from multi_turn.",
                                       choices=("auto", "single_turn", "multi_turn",
                                                "random_pool"))
    model: str | None = option(None, "--model", "Model name sent in the body (default with the "
                               "simulator: its model).", short="-m", aliases=("--model-names",))
    concurrency: int | None = common.concurrency("Sessions in flight (bench default 1, ab default "
                                                 "64; with --request-rate: a cap, default 1024).")
    request_count: int | None = common.request_count()
    warmup_request_count: int = common.warmup_request_count(0, "Warmup requests (ab default 3).")
    extra_inputs: tuple[str, ...] = common.extra_inputs(
        "KEY:VALUE merged into every body (values coerced); repeatable. ab default: seed A's "
        "max_tokens:150 min_tokens:150 ignore_eos:true.")
    streaming: bool = common.streaming()
    request_rate: float | None = common.request_rate()
    arrival: Arrival = common.arrival()
    burstiness: float = common.burstiness()
    ramp_to: float | None = common.ramp_to()
    fixed_schedule: bool = option(False, "--fixed-schedule", "Send each row at its 'timestamp' "
                                  "(ms after the first row's).", is_flag=True)
    benchmark_duration: float | None = option(None, "--benchmark-duration", "Stop issuing after "
                                              "this many seconds of profiling (dataset repeats).",
                                              kind=float, min=0, min_open=True, max=1e7)
    request_timeout: float = option(600.0, "--request-timeout", "Seconds before a request "
                                    "fails.", min=0, min_open=True, max=1e6,
                                    aliases=("--request-timeout-seconds",))
    headers: tuple[str, ...] = option((), "--header", "K:V request header; repeatable.",
                                      short="-H", multiple=True, show_default=False)
    api_key: str | None = option(None, "--api-key", "Sent as a Bearer token; never written to "
                                 "exports.", envvar="MMDATAGEN_API_KEY", show_envvar=True)
    endpoint_type: EndpointType = option("chat", "--endpoint-type", "OpenAI endpoint.",
                                         choices=("chat", "completions"))
    profile: str = common.profile("Simulator profile when no --url is given.")
    time_scale: float = common.time_scale("Simulator time scale (no --url).")
    sim_args: tuple[str, ...] = option((), "--sim-arg", "Extra argument passed to the embedded "
                                       "'mmdatagen serve'; repeatable.", multiple=True,
                                       show_default=False)
    http_client: HttpClient = option("raw", "--http-client", "raw asyncio HTTP/1.1 (fastest) or "
                                     "aiohttp.", choices=("raw", "aiohttp"))
    max_response_mb: float = option(64.0, "--max-response-mb", "Largest response read (MiB); a "
                                    "larger one fails as ResponseTooLarge.", min=1 / 1024,
                                    max=1_000_000)
    grace_period: float = option(30.0, "--grace-period", "Seconds to let in-flight requests "
                                 "finish after Ctrl-C.", min=0, max=1e6,
                                 aliases=("--benchmark-grace-period",))
    seed: int = common.seed("Seed of the arrivals and random_pool draws.")
    no_predict: bool = option(False, "--no-predict", "Skip the predicted cache hits.",
                              is_flag=True)
    server_log: Path | None = option(None, "--server-log", "The server's log file, read after "
                                     "the run: the order in which it first names each "
                                     "request's X-Request-ID is the order the cache saw them "
                                     "(vLLM: --enable-log-requests), so the prediction replays "
                                     "it exactly instead of the first-token order.", kind=Path,
                                     show_default=False)
    reset_cache: bool = option(False, "--reset-cache", "Empty the server's caches before "
                               "warmup: vLLM's dev-mode resets (VLLM_SERVER_DEV_MODE=1: "
                               "prefix, multimodal processor, encoder cache) and the "
                               "simulator's; says so when the server has none.", is_flag=True)
    quiet: bool = common.quiet("No progress bar and no table.")
    metrics_interval: float = option(1.0, "--metrics-interval", "Seconds between the server's "
                                     "/metrics scrapes during the run.", min=0, min_open=True,
                                     max=86400)

    @cached_property
    def header_map(self) -> dict[str, str]:
        """``headers`` (``K:V`` strings, as given) parsed once; read, never changed."""
        from .values import parse_headers

        return parse_headers(self.headers)

    def check(self) -> None:
        _ = self.extras, self.header_map  # parsed here: a bad one fails the spec's validation
        common.check_arrivals(self.arrival, self.burstiness, self.request_rate, self.ramp_to)
        if self.fixed_schedule and (self.warmup_request_count or self.request_rate
                                    or self.benchmark_duration):
            raise SpecError("fixed_schedule", "takes no warmup, `request_rate` or "
                            "`benchmark_duration`")
        if self.fixed_schedule and self.dataset_type == "random_pool":
            raise SpecError("fixed_schedule", "needs single_turn or multi_turn timestamps")


@spec
@dataclass(frozen=True)
class Repeats:
    """``sweep``: runs per grid point."""

    repeats: int = option(3, "--repeats", "Runs per point; metrics are reported as mean ± 95 % "
                          "CI (Student t).", min=1, max=1000)


@spec
@dataclass(frozen=True)
class BenchTarget:
    """``bench``: where the requests go and where the exports land."""

    url: str | None = option(None, "--url", "Server base URL; omit to run the embedded "
                             "simulator.")
    metrics_url: str | None = option(None, "--metrics-url", "Base URL whose /metrics holds the "
                                     "cache counters (default: --url). Dynamo's whole stack: "
                                     "the worker's system port (DYN_SYSTEM_PORT), not the "
                                     "frontend's.")
    output_dir: Path = option(Path("artifacts/bench"), "--output-dir", "Folder of the exports.",
                              kind=Path, aliases=("--output-artifact-dir", "--artifact-dir"))


@spec
@dataclass(frozen=True)
class LoadShard:
    """``bench``: one load worker of several (a Kubernetes Indexed Job), merged by merge-runs."""

    num_shards: int = option(1, "--num-shards", "Load workers sharing this benchmark: sessions "
                             "are dealt round-robin, counts, concurrency and rate divided.",
                             min=1, max=4096)
    shard_index: int = option(0, "--shard-index", "This worker (0-based; in an Indexed Job: "
                              "$JOB_COMPLETION_INDEX).", min=0, max=4095)
    start_at: float | None = option(None, "--start-at", "Unix time (seconds) every worker waits "
                                    "for before its first request; a past time is refused.",
                                    kind=float, min=0, max=1e11)

    def check(self) -> None:
        if self.shard_index >= self.num_shards:
            raise SpecError("shard_index", f"must be below num_shards ({self.num_shards})")


@spec
@dataclass(frozen=True)
class AbRuns:
    """``ab``: what differs between run A and run B, and where the comparison goes."""

    a_profile: str | None = option(None, "--a-profile", "Run A's simulator profile (default: "
                                   "--profile).")
    b_profile: str | None = option(None, "--b-profile", "Run B's simulator profile (default: "
                                   "--profile).")
    a_sim_arg: tuple[str, ...] = option((), "--a-sim-arg", "Extra serve argument for run A only.",
                                        multiple=True, show_default=False)
    b_sim_arg: tuple[str, ...] = option((), "--b-sim-arg", "Extra serve argument for run B only.",
                                        multiple=True, show_default=False)
    labels: tuple[str, str] = option(("Cache ON", "Cache OFF"), "--labels", "Names of run A and "
                                     "run B.", nargs=2, kind=str)
    output_dir: Path = option(Path("artifacts/ab"), "--output-dir", "Folder of both runs and the "
                              "comparison.", kind=Path)
    chart: bool = option(False, "--chart", "Also write comparison.png (needs matplotlib).",
                         is_flag=True)

    def check(self) -> None:
        check_labels(self.labels)
