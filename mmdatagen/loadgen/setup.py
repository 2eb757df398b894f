"""Specs -> :class:`BenchConfig`; ``ab`` as two bench runs checked up front, then compared."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..caches import DEFAULT_TARGET
from ..errors import SpecError, UserError
from ..spec.cache import AbCache, Geometry
from ..spec.load import AbRuns, Load, LoadShard
from .run import BenchConfig, BenchResult, check_config

AB_CONCURRENCY = 64


def bench_config(load: Load, *, url: str | None, cache_gb: float | None, output_dir: Path,
                 profile: str | None = None, sim_args: tuple[str, ...] = (),
                 goodput: tuple[str, ...] = (), cache: str | None = None,
                 geometry: Geometry | None = None,
                 encoder_budget: int | None = None,
                 metrics_url: str | None = None,
                 shard: LoadShard | None = None) -> BenchConfig:
    """One run's resolved config (the simulator's model name when no ``--model`` is given)."""
    from .goodput import parse_slos
    from .payload import parse_extra_inputs, parse_headers

    profile = profile or load.profile
    model = load.model
    if model is None:
        if url:
            raise SpecError("model", "is required with `url`")
        from ..sim.profile import load_profile

        model = load_profile(profile).served_model_name
    cfg = BenchConfig(
        input_file=load.input_file, model=model, url=url, dataset_type=load.dataset_type,
        concurrency=load.concurrency, request_count=load.request_count,
        warmup_request_count=load.warmup_request_count,
        extra_inputs=parse_extra_inputs(load.extra_inputs), streaming=load.streaming,
        output_dir=output_dir, request_rate=load.request_rate, arrival=load.arrival,
        burstiness=load.burstiness, ramp_to=load.ramp_to,
        benchmark_duration=load.benchmark_duration, request_timeout=load.request_timeout,
        headers=parse_headers(load.headers), api_key=load.api_key,
        endpoint_type=load.endpoint_type, profile=profile, cache_gb=cache_gb,
        sim_args=[*load.sim_args, *sim_args], time_scale=load.time_scale,
        http_client=load.http_client, grace_period=load.grace_period, seed=load.seed,
        quiet=load.quiet, predict=not load.no_predict, fixed_schedule=load.fixed_schedule,
        goodput=parse_slos(goodput), metrics_interval=load.metrics_interval,
        max_response_bytes=int(load.max_response_mb * (1 << 20)),
        cache=cache or DEFAULT_TARGET, cache_explicit=cache is not None,
        encoder_budget=encoder_budget, metrics_url=metrics_url, reset_cache=load.reset_cache,
        model_path=None if geometry is None or geometry.model_path is None
        else str(geometry.model_path),
        geometry={} if geometry is None else geometry.values())
    if shard is not None:
        cfg = replace(cfg, num_shards=shard.num_shards, shard_index=shard.shard_index,
                      start_at=shard.start_at)
    check_config(cfg)
    return cfg


def ab_configs(load: Load, runs: AbRuns, cache: AbCache, goodput: tuple[str, ...] = ()
               ) -> list[tuple[str, str, BenchConfig]]:
    """(tag, label, config) of run A and run B, both checked before either starts (their
    simulator settings too: ``run.simulator_spec``)."""
    if load.concurrency is None and load.request_rate is None:
        load = replace(load, concurrency=AB_CONCURRENCY)
    out = []
    for tag, gb, prof, extra, label in (
            ("a", cache.a_cache_size, runs.a_profile, runs.a_sim_arg, runs.labels[0]),
            ("b", cache.b_cache_size, runs.b_profile, runs.b_sim_arg, runs.labels[1])):
        try:
            cfg = bench_config(load, url=None, cache_gb=gb,
                               output_dir=Path(runs.output_dir) / tag, profile=prof,
                               sim_args=extra, goodput=goodput)
        except UserError as exc:
            raise UserError(f"run {tag.upper()}: {exc}") from None
        out.append((tag, label, cfg))
    return out


def run_ab(load: Load, runs: AbRuns, cache: AbCache,
           on_start: Callable[[str, str, BenchConfig], None] | None = None,
           on_done: Callable[[str, BenchResult], None] | None = None,
           goodput: tuple[str, ...] = ()) -> list[dict]:
    """Both runs on the embedded simulator; their exports. A stopped run stops ``ab`` (exit
    143 / 130), a run whose every request failed fails it (``run.finish_run``)."""
    from .run import finish_run, run_bench

    exports = []
    for tag, label, cfg in ab_configs(load, runs, cache, goodput):
        if on_start is not None:
            on_start(tag, label, cfg)
        result = run_bench(cfg)
        if on_done is not None and result.stopped_by is None:
            on_done(tag, result)
        finish_run(result, f"run {tag.upper()}")
        exports.append(result.export)
    return exports


def run_summary(tag: str, ex: dict) -> str:
    """One line per ab run: counts, errors, measured vs predicted image hit rate."""
    cache = ex.get("image_cache") or {}
    parts = [f"   run {tag.upper()}: {ex['request_count']['avg']:,} ok, "
             f"{ex['error_request_count']['avg']:,} errors"]
    for key in ("measured", "predicted"):
        rate = (cache.get(key) or {}).get("hit_rate")
        if rate is not None:
            parts.append(f"{key} image hit rate {rate:.1%}")
    return ", ".join(parts)


def goodput_line(export: dict) -> str:
    """The console line under bench's table when objectives were given."""
    gp = export["goodput"]
    return (f"Goodput: {export['good_request_count']['avg']:,} good requests, "
            f"{gp['avg'] or 0:,.2f} req/s (objectives "
            + ", ".join(f"{k} <= {v:g}" for k, v in gp["slos"].items()) + ")")
