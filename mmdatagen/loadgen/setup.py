"""Specs -> :class:`~mmdatagen.settings.run.BenchRun`; ``ab`` as two bench runs checked up front,
then compared."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..errors import SpecError, UserError
from ..io.atomic import check_not_input
from ..settings.cache import AbCache, BenchCache, Geometry
from ..settings.load import AbRuns, BenchTarget, Load, LoadShard
from ..settings.run import BenchRun
from .run import BenchResult, check_run, run_outputs

AB_CONCURRENCY = 64


def bench_run(load: Load, target: BenchTarget | None = None, cache: BenchCache | None = None,
              geometry: Geometry | None = None, shard: LoadShard | None = None,
              goodput: tuple[str, ...] = ()) -> BenchRun:
    """One run from its specs, checked whole: the embedded simulator's settings too (the
    simulator's model name when no ``--model`` is given; ``--goodput`` parsed)."""
    from ..sim.profile import load_profile
    from .goodput import parse_slos

    target = target or BenchTarget()
    if load.model is None:
        if target.url:
            raise SpecError("model", "is required with `url`")
        load = replace(load, model=load_profile(load.profile).served_model_name)
    run = BenchRun(load, target, cache or BenchCache(), geometry or Geometry(),
                   shard or LoadShard(), tuple(parse_slos(goodput).items()))
    check_run(run)
    out = Path(target.output_dir)
    check_not_input(run_outputs(out), [load.input_file])
    if not target.url:
        load_profile(load.profile)
        run.simulator()  # checks every setting, the cache size too (settings.cache.SimCache)
    return run


def ab_runs(load: Load, runs: AbRuns, cache: AbCache, goodput: tuple[str, ...] = ()
            ) -> list[tuple[str, str, BenchRun]]:
    """(tag, label, run) of run A and run B, both checked before either starts (their
    simulator settings too: ``BenchRun.simulator``)."""
    if load.concurrency is None and load.request_rate is None:
        load = replace(load, concurrency=AB_CONCURRENCY)
    out = []
    for tag, size, prof, extra, label in (
            ("a", cache.a_cache_size, runs.a_profile, runs.a_sim_arg, runs.labels[0]),
            ("b", cache.b_cache_size, runs.b_profile, runs.b_sim_arg, runs.labels[1])):
        one = replace(load, profile=prof or load.profile, sim_args=(*load.sim_args, *extra))
        try:
            run = bench_run(one, BenchTarget(output_dir=runs.output_dir / tag),
                            BenchCache(cache_size=size), goodput=goodput)
        except UserError as exc:
            raise UserError(f"run {tag.upper()}: {exc}") from None
        out.append((tag, label, run))
    return out


def run_ab(load: Load, runs: AbRuns, cache: AbCache,
           on_start: Callable[[str, str, BenchRun], None] | None = None,
           on_done: Callable[[str, BenchResult], None] | None = None,
           goodput: tuple[str, ...] = ()) -> list[dict]:
    """Both runs on the embedded simulator; their exports. A stopped run stops ``ab`` (exit
    143 / 130), a run whose every request failed fails it (``run.finish_run``)."""
    from .run import finish_run, run_bench

    exports = []
    for tag, label, run in ab_runs(load, runs, cache, goodput):
        if on_start is not None:
            on_start(tag, label, run)
        result = run_bench(run)
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
