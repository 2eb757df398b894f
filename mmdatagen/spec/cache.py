"""Cache-capacity and model-geometry options.

OWNED BY THE LEAD ENGINEER (issue 10 reworks these into cache targets). Declared here as they
behave today so the generated CLI keeps them unchanged; edit this module rather than the
commands when they change.
"""
from __future__ import annotations

from typing import Literal

from .base import option, spec

KeyMode = Literal["bytes", "pixels", "reference", "uuid"]
Register = Literal["schedule", "encode", "completion"]

KEY_MODES: tuple[str, ...] = ("bytes", "pixels", "reference", "uuid")
REGISTER: tuple[str, ...] = ("schedule", "encode", "completion")
GIB_MAX = 1e6


@spec
class SimCache:
    """The simulator's embedding cache (``serve``, ``simulate``)."""

    embedding_cache_gb: float = option(10.0, "--embedding-cache-gb", "Embedding cache capacity "
                                       "in GiB (0 = off).", min=0, max=GIB_MAX)
    key_mode: KeyMode | None = option(None, "--key-mode", "Cache key: encoded bytes (vLLM), "
                                      "pixels (Dynamo aggregated), reference string (Dynamo "
                                      "disaggregated), uuid. Default: profile's.",
                                      choices=KEY_MODES)
    register: Register | None = option(None, "--register", "When a missed image enters the "
                                       "cache: at scheduling, after its encode step, or at "
                                       "request completion. Default: profile's.",
                                       choices=REGISTER)


@spec
class SweepCache:
    """``simulate --sweep-cache-gb``: one virtual run per size."""

    sweep_cache_gb: str | None = option(None, "--sweep-cache-gb", "Comma-separated cache sizes "
                                        "in GiB: one virtual run each, printed as a table (and "
                                        "sweep.json in --output-dir) instead of one run's export.")


@spec
class BenchCache:
    """``bench``: the embedded simulator's cache and the predicted hits."""

    cache_gb: float = option(10.0, "--cache-gb", "Embedding cache GiB of the embedded simulator, "
                             "and for the predicted hits.", min=0, max=GIB_MAX)


@spec
class AbCache:
    """``ab``: each run's cache."""

    a_cache_gb: float = option(10.0, "--a-cache-gb", "Run A's cache.", min=0, max=GIB_MAX)
    b_cache_gb: float = option(0.0, "--b-cache-gb", "Run B's cache.", min=0, max=GIB_MAX)


@spec
class AnalyzeModel:
    """``analyze``: the model geometry and the concurrency model of the prediction."""

    tokens_per_image: int | None = option(None, "--tokens-per-image", "Generic model: fixed "
                                          "tokens per image.", kind=int, min=1, max=10_000_000)
    bytes_per_token: int | None = option(None, "--bytes-per-token", "Generic model: cache bytes "
                                         "per token.", kind=int, min=1, max=10_000_000)
    in_flight: int = option(1, "--in-flight", "Requests (file order) or sessions (--dispatch "
                            "sessions) in flight; they complete first-in first-out.", min=1,
                            max=1_000_000)
