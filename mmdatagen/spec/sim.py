"""Simulator specs: the engine profile, ``serve``'s server and faults, ``simulate``'s run."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import common
from .base import option, spec


@spec
@dataclass(frozen=True)
class Engine:
    """Which performance model, and overrides of its scheduler limits."""

    profile: str = common.profile("Profile name (configs/profiles) or YAML path.")
    max_running: int | None = option(None, "--max-running", "Override max running requests.",
                                     kind=int, min=1, max=1_000_000)
    token_budget: int | None = option(None, "--token-budget", "Override per-step token budget.",
                                      kind=int, min=1, max=1_000_000_000)


@spec
@dataclass(frozen=True)
class Server:
    """``serve``: where it listens and how it answers."""

    host: str = option("127.0.0.1", "--host", "Address to bind (loopback by default).")
    port: int = option(8000, "--port", "Port (0 = any free port).", min=0, max=65535)
    time_scale: float = common.time_scale("Wall seconds per simulated second (>1 slows the "
                                          "model down so a small machine keeps up).")
    served_model_name: tuple[str, ...] = option((), "--served-model-name", "Model name(s) to "
                                                "accept (default: the profile's).", multiple=True,
                                                show_default=False)
    api_key: str | None = option(None, "--api-key", "Require 'Authorization: Bearer KEY' (or env "
                                 "MMDATAGEN_SERVE_API_KEY).", envvar="MMDATAGEN_SERVE_API_KEY")
    ready_file: Path | None = option(None, "--ready-file", "Write {url, port, pid} as JSON here "
                                     "once listening.", kind=Path, dir_okay=False)


@spec
@dataclass(frozen=True)
class Faults:
    """``serve``: seeded fault injection (see sim/faults.py)."""

    fault_error_rate: float = option(0.0, "--fault-error-rate", "Fraction of requests answered "
                                     "with an error.", min=0, max=1)
    fault_error_status: int = option(500, "--fault-error-status", "HTTP status of injected "
                                     "errors.", min=400, max=599)
    fault_disconnect_rate: float = option(0.0, "--fault-disconnect-rate", "Fraction of streams "
                                          "cut mid-way.", min=0, max=1)
    fault_stall_first_rate: float = option(0.0, "--fault-stall-first-rate", "Fraction stalled "
                                           "before the first token.", min=0, max=1)
    fault_stall_token_rate: float = option(0.0, "--fault-stall-token-rate", "Fraction stalled "
                                           "between two tokens.", min=0, max=1)
    fault_stall_ms: float = option(1000.0, "--fault-stall-ms", "Stall length.", min=0, max=1e7)
    fault_malformed_rate: float = option(0.0, "--fault-malformed-rate", "Fraction of streams with "
                                         "a malformed SSE event.", min=0, max=1)
    fault_seed: int = option(0, "--fault-seed", "Seed of the fault draws.", min=0,
                             max=common.SEED_MAX)


@spec
@dataclass(frozen=True)
class VirtualRun:
    """``simulate``: the benchmark to predict in virtual time."""

    concurrency: int | None = common.concurrency("Sessions in flight, as AIPerf's --concurrency "
                                                 "(default 1; with --request-rate a cap, "
                                                 "default 1024).")
    request_rate: float | None = common.request_rate()
    arrival: str = common.arrival()
    seed: int = common.seed("Seed of the poisson arrivals (the loader's default draws the same "
                            "gaps).")
    request_count: int | None = common.request_count("Profiling requests (default: rows).")
    warmup_request_count: int = common.warmup_request_count(0, "Warmup requests.")
    extra_inputs: tuple[str, ...] = common.extra_inputs("KEY:VALUE sent with every request "
                                                        "(max_tokens, min_tokens, ignore_eos).")
    streaming: bool = common.streaming()
    output_dir: Path | None = option(None, "--output-dir", "Write profile_export_mmdatagen.json "
                                     "and records.jsonl here.", kind=Path)
    quiet: bool = common.quiet("No table.")
