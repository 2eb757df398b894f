"""``mmdatagen serve`` (real-time simulator over HTTP) and ``mmdatagen simulate`` (virtual time)."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import UserError
from ..io.imageref import KEY_MODES

_REGISTER = ("schedule", "encode", "completion")


def _profile_options(f):
    opts = [
        click.option("--profile", default="qwen3-vl-30b-gb200", show_default=True,
                     help="Profile name (configs/profiles) or YAML path."),
        click.option("--embedding-cache-gb", type=float, default=10.0, show_default=True,
                     help="Embedding cache capacity in GiB (0 = off)."),
        click.option("--key-mode", type=click.Choice(KEY_MODES), default=None,
                     help="Cache key: encoded bytes (vLLM), pixels (Dynamo aggregated), "
                          "reference string (Dynamo disaggregated), uuid. Default: profile's."),
        click.option("--register", type=click.Choice(_REGISTER), default=None,
                     help="When a missed image enters the cache: at scheduling, after its encode "
                          "step, or at request completion. Default: profile's."),
        click.option("--max-running", type=int, default=None, help="Override max running requests."),
        click.option("--token-budget", type=int, default=None, help="Override per-step token budget."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _load(profile: str, embedding_cache_gb: float, key_mode, register, max_running, token_budget):
    from ..sim.profile import load_profile

    if embedding_cache_gb < 0:
        raise UserError("--embedding-cache-gb must not be negative")
    return load_profile(profile).with_overrides(key_mode=key_mode, register=register,
                                                max_running=max_running,
                                                token_budget=token_budget)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", type=int, default=8000, show_default=True, help="Port (0 = any free port).")
@_profile_options
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Wall seconds per simulated second (>1 slows the model down so a small machine keeps up).")
@click.option("--served-model-name", multiple=True, help="Model name(s) to accept (default: the profile's).")
@click.option("--api-key", envvar="MMDATAGEN_SERVE_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' (or env MMDATAGEN_SERVE_API_KEY).")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write {url, port, pid} as JSON here once listening.")
@click.option("--fault-error-rate", type=float, default=0.0, help="Fraction of requests answered with an error.")
@click.option("--fault-error-status", type=int, default=500, show_default=True)
@click.option("--fault-disconnect-rate", type=float, default=0.0, help="Fraction of streams cut mid-way.")
@click.option("--fault-stall-first-rate", type=float, default=0.0, help="Fraction stalled before the first token.")
@click.option("--fault-stall-token-rate", type=float, default=0.0, help="Fraction stalled between two tokens.")
@click.option("--fault-stall-ms", type=float, default=1000.0, show_default=True)
@click.option("--fault-malformed-rate", type=float, default=0.0, help="Fraction of streams with a malformed SSE event.")
@click.option("--fault-seed", type=int, default=0, show_default=True)
def serve(host, port, profile, embedding_cache_gb, key_mode, register, max_running, token_budget,
          time_scale, served_model_name, api_key, ready_file, fault_error_rate, fault_error_status,
          fault_disconnect_rate, fault_stall_first_rate, fault_stall_token_rate, fault_stall_ms,
          fault_malformed_rate, fault_seed):
    """Serve an OpenAI-compatible VLM serving SIMULATOR (a performance model, not a language model)."""
    from ..sim.faults import FaultConfig
    from ..sim.run import run
    from ..sim.server import SimServer

    if time_scale <= 0:
        raise UserError("--time-scale must be positive")
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {port}")
    prof = _load(profile, embedding_cache_gb, key_mode, register, max_running, token_budget)
    faults = FaultConfig(fault_error_rate, fault_error_status, fault_disconnect_rate,
                         fault_stall_first_rate, fault_stall_token_rate, fault_stall_ms,
                         fault_malformed_rate, fault_seed).validate()
    sim = SimServer(prof, embedding_cache_gb, time_scale, faults, api_key, tuple(served_model_name))
    run(sim, host, port, ready_file)


@click.command()
@click.argument("dataset", type=click.Path(path_type=Path))
@_profile_options
@click.option("--concurrency", type=int, default=None,
              help="Sessions in flight, as AIPerf's --concurrency (default 1; with "
                   "--request-rate a cap, default 1024).")
@click.option("--request-rate", type=float, default=None, help="Requests per second (paced).")
@click.option("--arrival", type=click.Choice(["poisson", "constant"]), default="poisson",
              show_default=True, help="Arrival process with --request-rate.")
@click.option("--random-seed", "seed", type=int, default=0, show_default=True,
              help="Seed of the poisson arrivals (the loader's default draws the same gaps).")
@click.option("--request-count", type=int, default=None, help="Profiling requests (default: rows).")
@click.option("--warmup-request-count", type=int, default=0, show_default=True)
@click.option("--extra-inputs", multiple=True,
              help="KEY:VALUE sent with every request (max_tokens, min_tokens, ignore_eos).")
@click.option("--streaming/--no-streaming", default=True, show_default=True)
@click.option("--output-dir", type=click.Path(path_type=Path), default=None,
              help="Write profile_export_mmdatagen.json and records.jsonl here.")
@click.option("--sweep-cache-gb", default=None,
              help="Comma-separated cache sizes in GiB: one virtual run each, printed as a table "
                   "(and sweep.json in --output-dir) instead of one run's export.")
@click.option("-q", "--quiet", is_flag=True, help="No table.")
def simulate(dataset, profile, embedding_cache_gb, key_mode, register, max_running, token_budget,
             concurrency, request_rate, arrival, seed, request_count, warmup_request_count,
             extra_inputs, streaming, output_dir, sweep_cache_gb, quiet):
    """Predict a benchmark's metrics in virtual time (no HTTP, no sleeping): same metrics and
    export shape as ``mmdatagen bench``, from the simulator's performance model."""
    from ..loadgen.payload import parse_extra_inputs
    from ..metrics import build_export, console_table, write_exports
    from ..sim.virtual import OutputPolicy, run_simulation

    prof = _load(profile, embedding_cache_gb, key_mode, register, max_running, token_budget)
    if concurrency is None:
        concurrency = 1024 if request_rate else 1
    if request_rate is not None and request_rate <= 0:
        raise UserError("--request-rate must be positive")
    if concurrency < 1:
        raise UserError("--concurrency must be >= 1")
    if request_count is not None and request_count < 1:
        raise UserError("--request-count must be >= 1")
    if warmup_request_count < 0:
        raise UserError("--warmup-request-count must not be negative")
    if not Path(dataset).is_file():
        raise UserError(f"dataset {dataset} does not exist")
    extra = parse_extra_inputs(extra_inputs)
    policy = OutputPolicy(_opt_int(extra, "max_completion_tokens") or _opt_int(extra, "max_tokens"),
                          _opt_int(extra, "min_tokens") or 0, bool(extra.get("ignore_eos", False)))
    if sweep_cache_gb is not None:
        _sweep(Path(dataset), prof, sweep_cache_gb, output_dir, quiet, concurrency=concurrency,
               request_count=request_count, warmup_count=warmup_request_count, policy=policy,
               streaming=streaming, request_rate=request_rate, arrival=arrival, seed=seed)
        return
    res = run_simulation(Path(dataset), prof, embedding_cache_gb, concurrency, request_count,
                         warmup_request_count, policy, streaming, request_rate, arrival, seed)
    cache = res.engine.cache.counters()
    config = {"mode": "simulate", "dataset": str(dataset), "profile": prof.name,
              "embedding_cache_gb": embedding_cache_gb, "key_mode": prof.key_mode,
              "register": prof.register, "concurrency": concurrency,
              "request_rate": request_rate, "arrival": arrival if request_rate else None,
              "request_count": request_count, "warmup_request_count": warmup_request_count,
              "extra_inputs": extra, "streaming": streaming}
    export = build_export(res.records, input_config=config,
                          run_info={"simulated": True, "clock": "virtual",
                                    "note": "mmdatagen simulator: a performance model",
                                    "embedding_cache": cache, "engine_steps": res.engine.steps})
    if output_dir is not None:
        write_exports(Path(output_dir), res.records, export)
    if not quiet:
        click.echo(console_table(export))
        q = max(1, cache["queries"])
        click.echo(f"embedding cache: {cache['hits']}/{cache['queries']} hits ({cache['hits'] / q:.1%}), "
                   f"{cache['evictions']} evictions, {cache['entries']} entries held (simulated)")


def _sweep(dataset: Path, prof, spec: str, output_dir: Path | None, quiet: bool,
           request_count: int | None, **kw) -> None:
    import orjson

    from ..io.atomic import atomic_open
    from ..sim.virtual import load_turns, sweep_cache, sweep_table

    try:
        sizes = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--sweep-cache-gb expects numbers like 0,0.5,10, got {spec!r}") from None
    if not sizes or any(x < 0 for x in sizes):
        raise UserError("--sweep-cache-gb needs one or more sizes >= 0")
    turns = load_turns(dataset, prof)
    rows = sweep_cache(turns, prof, sizes, request_count=request_count or len(turns),
                       wrap=request_count is not None, **kw)
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        with atomic_open(Path(output_dir) / "sweep.json", "wb") as fh:
            fh.write(orjson.dumps({"profile": prof.name, "dataset": str(dataset), "rows": rows},
                                  option=orjson.OPT_INDENT_2))
    if not quiet:
        click.echo(sweep_table(rows))
        click.echo("(simulated: mmdatagen's performance model, not a measurement)")


def _opt_int(extra: dict, key: str) -> int | None:
    v = extra.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key != "min_tokens" else 0):
        raise UserError(f"--extra-inputs {key} must be a positive integer")
    return v
