"""Simulator specs: the engine profile, ``serve``'s server and faults, ``simulate``'s run, and
:class:`Simulator` (every ``serve`` setting in one value, for the embedded simulator)."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import SpecError, UserError
from . import common
from .base import option, spec, validate
from .cache import Geometry, SimCache


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
class VirtualRun(common.ExtraInputs):
    """``simulate``: the benchmark to predict in virtual time."""

    concurrency: int | None = common.concurrency("Sessions in flight, as AIPerf's --concurrency "
                                                 "(default 1; with --request-rate a cap, "
                                                 "default 1024).")
    request_rate: float | None = common.request_rate()
    arrival: str = common.arrival()
    burstiness: float = common.burstiness()
    ramp_to: float | None = common.ramp_to()
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

    def check(self) -> None:
        _ = self.extras  # parsed here: a bad one fails the spec's validation
        common.check_arrivals(self.arrival, self.burstiness, self.request_rate, self.ramp_to)


@dataclass(frozen=True)
class Simulator:
    """Every setting of one ``serve``: what the embedded simulator's child process receives,
    as JSON on its standard input (``sim/child.py``), instead of a command line."""

    server: Server = field(default_factory=Server)
    engine: Engine = field(default_factory=Engine)
    cache: SimCache = field(default_factory=SimCache)
    geometry: Geometry = field(default_factory=Geometry)
    faults: Faults = field(default_factory=Faults)

    def validated(self) -> Simulator:
        return Simulator(*(validate(getattr(self, part)) for part in PARTS))

    def with_values(self, values: Mapping[str, Any]) -> Simulator:
        """A copy with fields replaced by name (any part's), every part validated."""
        unknown = set(values) - {f.name for part in PARTS for f in fields(PART_TYPES[part])}
        if unknown:
            raise UserError(f"unknown simulator settings: {', '.join(sorted(unknown))}")
        return Simulator(*(replace(getattr(self, part), **{
            f.name: values[f.name] for f in fields(PART_TYPES[part]) if f.name in values})
            for part in PARTS)).validated()

    def to_json(self) -> bytes:
        doc = {part: {f.name: _plain(getattr(getattr(self, part), f.name))
                      for f in fields(PART_TYPES[part])} for part in PARTS}
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Simulator:
        """The spec back from :meth:`to_json`, checked field by field like a flag's value."""
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise UserError(f"simulator settings are not JSON: {exc}") from None
        if not isinstance(doc, dict) or set(doc) - set(PARTS):
            raise UserError("simulator settings must be an object of "
                            f"{', '.join(PARTS)}")
        values: dict[str, Any] = {}
        for part, body in doc.items():
            if not isinstance(body, dict):
                raise UserError(f"simulator settings: {part} must be an object")
            values.update(body)
        return cls().with_values(values)


PARTS = ("server", "engine", "cache", "geometry", "faults")
PART_TYPES: dict[str, type] = {"server": Server, "engine": Engine, "cache": SimCache,
                               "geometry": Geometry, "faults": Faults}


def _plain(value: Any) -> Any:
    """A field value as JSON: paths as strings, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def parse_sim_args(args: Sequence[str], base: Simulator) -> Simulator:
    """``--sim-arg`` values (``serve`` flags as strings: the escape hatch of ``bench``, ``ab``
    and ``sweep``) parsed by the options generated from the same fields as ``serve``'s, laid
    over ``base`` (only the flags given), and validated: a bad one is one ``UserError``
    naming the flag, before any server starts."""
    from .base import for_cli
    from .cli import given_flags

    if not args:
        return base
    try:
        return base.with_values(given_flags(PART_TYPES.values(), args, "serve"))
    except SpecError as exc:
        raise UserError(f"--sim-arg: {for_cli(exc)}") from None
    except UserError as exc:
        raise UserError(f"--sim-arg: {exc}") from None
