"""Fields shared by several specs: one declaration per concept (name, default, help, bounds)."""
from __future__ import annotations

from functools import cached_property
from typing import Any

from ..arrivals import ARRIVALS
from ..errors import SpecError
from .base import option

SEED_MAX = 2**63 - 1


def seed(help: str = "Seed: fixes every byte of the output.") -> Any:
    return option(0, "--seed", help, min=0, max=SEED_MAX, aliases=("--random-seed",))


def quiet(help: str = "No progress bar, no summary.") -> Any:
    return option(False, "--quiet", help, short="-q", is_flag=True)


def workers(help: str) -> Any:
    return option(0, "--workers", f"{help} (0: all cores).", min=0, max=4096)


def force() -> Any:
    return option(False, "--force", "Overwrite existing outputs.", short="-f", is_flag=True)


def time_scale(help: str) -> Any:
    return option(1.0, "--time-scale", help, min=0, min_open=True, max=1e6)


def profile(help: str = "Simulator profile: a name in configs/profiles or a YAML path.") -> Any:
    return option("qwen3-vl-30b-gb200", "--profile", help)


def concurrency(help: str) -> Any:
    return option(None, "--concurrency", help, kind=int, min=1, max=1_000_000)


MIN_RATE = 1e-3  # requests/s: a slower rate's first gap (hours, or 1e300 s) reads as a hang


def request_rate() -> Any:
    return option(None, "--request-rate", "Requests per second (paced by --arrival; at least "
                  "0.001).", kind=float, min=MIN_RATE, max=1e6)


def arrival() -> Any:
    return option("poisson", "--arrival", "Arrival process with --request-rate: poisson, "
                  "constant, or gamma (shape --burstiness).",
                  choices=ARRIVALS, aliases=("--arrival-pattern",))


def burstiness() -> Any:
    return option(1.0, "--burstiness", "Shape of the gamma inter-arrival gaps (--arrival "
                  "gamma; vLLM's meaning): below 1 burstier than Poisson, 1 Poisson, above 1 "
                  "more regular. The mean gap stays 1/rate.", min=0, min_open=True, max=1e6)


def ramp_to() -> Any:
    return option(None, "--ramp-to", "Raise (or lower) the request rate linearly from "
                  "--request-rate to this rate over the benchmark duration (without "
                  "--benchmark-duration: the time the request count takes at the mean rate).",
                  kind=float, min=MIN_RATE, max=1e6)


def check_arrivals(arrival: str, burstiness: float, request_rate: float | None,
                   ramp_to: float | None) -> None:
    """The arrival options that only make sense together."""
    if burstiness != 1.0 and arrival != "gamma":
        raise SpecError("burstiness", "needs `arrival` gamma")
    if ramp_to is not None and request_rate is None:
        raise SpecError("ramp_to", "needs `request_rate` (the rate the ramp starts from)")


def request_count(help: str = "Profiling requests (default: one pass over the dataset).") -> Any:
    return option(None, "--request-count", help, kind=int, min=1, max=1_000_000_000)


def warmup_request_count(default: int | None, help: str) -> Any:
    return option(default, "--warmup-request-count", help, kind=int, min=0, max=1_000_000_000)


def extra_inputs(help: str) -> Any:
    return option((), "--extra-inputs", help, multiple=True, show_default=False)


class ExtraInputs:
    """A spec with an ``extra_inputs`` field (``KEY:VALUE`` and JSON strings, as given) reads
    them once, here: ``extras`` is the body fields they stand for (a bad one is a
    ``SpecError`` naming the field, raised by the spec's validation). Callers read it, never
    change it (the spec is frozen; the dict is its one parse)."""

    extra_inputs: tuple[str, ...]

    @cached_property
    def extras(self) -> dict[str, Any]:
        from .values import parse_extra_inputs

        return parse_extra_inputs(self.extra_inputs)


def streaming() -> Any:
    return option(True, "--streaming", "Stream responses (SSE); time to first token needs it.",
                  negatable=True)
