"""Fields shared by several specs: one declaration per concept (name, default, help, bounds)."""
from __future__ import annotations

from typing import Any

from .base import option

SEED_MAX = 2**63 - 1


def seed(help: str = "Seed: fixes every byte of the output.") -> Any:
    return option(0, "--seed", help, min=0, max=SEED_MAX, aliases=("--random-seed",))


def quiet(help: str = "No progress bar, no summary.") -> Any:
    return option(False, "--quiet", help, short="-q", is_flag=True)


def force() -> Any:
    return option(False, "--force", "Overwrite existing outputs.", short="-f", is_flag=True)


def time_scale(help: str) -> Any:
    return option(1.0, "--time-scale", help, min=0, min_open=True, max=1e6)


def profile(help: str = "Simulator profile: a name in configs/profiles or a YAML path.") -> Any:
    return option("qwen3-vl-30b-gb200", "--profile", help)


def concurrency(help: str) -> Any:
    return option(None, "--concurrency", help, kind=int, min=1, max=1_000_000)


def request_rate() -> Any:
    return option(None, "--request-rate", "Requests per second (paced by --arrival).",
                  kind=float, min=0, min_open=True, max=1e6)


def arrival() -> Any:
    return option("poisson", "--arrival", "Arrival process with --request-rate.",
                  choices=("poisson", "constant"), aliases=("--arrival-pattern",))


def request_count(help: str = "Profiling requests (default: one pass over the dataset).") -> Any:
    return option(None, "--request-count", help, kind=int, min=1, max=1_000_000_000)


def warmup_request_count(default: int | None, help: str) -> Any:
    return option(default, "--warmup-request-count", help, kind=int, min=0, max=1_000_000_000)


def extra_inputs(help: str) -> Any:
    return option((), "--extra-inputs", help, multiple=True, show_default=False)


def streaming() -> Any:
    return option(True, "--streaming", "Stream responses (SSE); time to first token needs it.",
                  negatable=True)
