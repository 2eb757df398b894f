"""The library call behind ``mmdatagen simulate``: specs -> virtual run(s) -> export or sweep."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..caches import CacheTarget
from ..errors import SpecError, UserError
from ..scheduling import slots_for
from ..settings.cache import Geometry, SimCache, SweepCache
from ..settings.sim import Engine, VirtualRun
from .profile import Profile


def load_engine_profile(engine: Engine, cache: SimCache) -> Profile:
    """The named profile with the spec's overrides applied (validated)."""
    from .profile import load_profile

    return load_profile(engine.profile).for_cache(cache.cache).with_overrides(
        key_mode=cache.key, register=cache.register, max_running=engine.max_running,
        token_budget=engine.token_budget, encoder_budget=cache.encoder_budget)


def simulator_target(settings: Any) -> CacheTarget:
    """The cache target a simulator's settings (``settings.sim.Simulator``) run: ``--cache``,
    else its profile's."""
    return load_engine_profile(settings.engine, settings.cache).cache_target()


def cache_text(settings: Any) -> str:
    """A simulator's cache (``settings.sim.Simulator``) as people read it, in its target's unit:
    ``dynamo-embedding 10 GiB``, ``vllm-encoder 8192 tokens``."""
    target = simulator_target(settings)
    return f"{target.name} {target.size_text(settings.cache.cache_size)}"


def engine_model(prof: Profile, geometry: Geometry | None):
    """The model whose geometry the simulator sizes images with: the profile's, or a local
    folder / geometry values given on the command line."""
    from ..vlm import resolve_model

    if geometry is None:
        return resolve_model(prof.model)
    return resolve_model(prof.model, geometry.model_path, **geometry.values())


def output_policy(extra: dict[str, Any]):  # -> virtual.OutputPolicy
    """max_tokens / min_tokens / ignore_eos from the parsed ``--extra-inputs``."""
    from .virtual import OutputPolicy

    max_tokens = _opt_int(extra, "max_completion_tokens") or _opt_int(extra, "max_tokens")
    return OutputPolicy(max_tokens, _opt_int(extra, "min_tokens") or 0,
                        bool(extra.get("ignore_eos", False)))


def _opt_int(extra: dict, key: str) -> int | None:
    v = extra.get(key)
    if v is None:
        return None
    low, kind = (0, "a non-negative") if key == "min_tokens" else (1, "a positive")
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise SpecError("extra_inputs", f"{key} must be {kind} integer")
    return v


@dataclass
class Study:
    """One virtual run's export (and what the console shows), or a sweep's rows."""

    export: dict | None = None
    cache: dict | None = None
    sweep: list[dict] | None = None
    profile: str = ""
    unit: str = "GiB"  # of the cache sizes: the profile's cache target's
    slo: tuple[str, float] | None = None  # the what-if's objective (row key, ms)
    whatif: dict | None = None  # the sweep's document (sweep.json): what its report shows


def simulate_dataset(dataset: Path, engine: Engine, cache: SimCache, sweep: SweepCache,
                     run: VirtualRun, geometry: Geometry | None = None) -> Study:
    """Run ``simulate``: the export of one virtual run, or one row per swept cache size."""
    prof = load_engine_profile(engine, cache)
    if not Path(dataset).is_file():
        raise UserError(f"dataset {dataset} does not exist")
    extra = dict(run.extras)
    concurrency = slots_for(run.concurrency, run.request_rate)
    kw = dict(concurrency=concurrency, warmup_count=run.warmup_request_count,
              policy=output_policy(extra), streaming=run.streaming,
              request_rate=run.request_rate, arrival=run.arrival, seed=run.seed,
              burstiness=run.burstiness, ramp_to=run.ramp_to,
              model=engine_model(prof, geometry))
    if sweep.cache_size:
        from .whatif import parse_slo

        slo = parse_slo(sweep.slo)
        unit = prof.cache_target().unit
        doc = _sweep(Path(dataset), prof, sweep.sizes(), run, kw, (unit, slo))
        return Study(sweep=doc["rows"], profile=prof.name, unit=unit, slo=slo, whatif=doc)
    return _one(Path(dataset), prof, cache, run, extra, concurrency, kw)


def _one(dataset: Path, prof: Profile, cache: SimCache, run: VirtualRun, extra: dict,
         concurrency: int, kw: dict) -> Study:
    from ..export import build_export, write_exports
    from .virtual import run_simulation

    target = prof.cache_target()
    capacity = target.resolve(cache.cache_size)
    res = run_simulation(dataset, prof, capacity, concurrency, run.request_count,
                         run.warmup_request_count, kw["policy"], run.streaming, run.request_rate,
                         run.arrival, run.seed, model=kw["model"], burstiness=run.burstiness,
                         ramp_to=run.ramp_to)
    engine = res.engine
    assert engine is not None  # a run always has its engine
    counters = engine.cache.counters()
    config = {"mode": "simulate", "dataset": str(dataset), "profile": prof.name,
              "cache": target.name, "cache_size": capacity, "cache_unit": target.unit,
              "embedding_cache_gb": capacity,
              "key_mode": prof.cache_target().key, "register": prof.cache_target().present,
              "concurrency": concurrency,
              "request_rate": run.request_rate,
              "arrival": run.arrival if run.request_rate else None,
              "burstiness": run.burstiness if run.arrival == "gamma" else None,
              "ramp_to": run.ramp_to,
              "request_count": run.request_count,
              "warmup_request_count": run.warmup_request_count,
              "extra_inputs": extra, "streaming": run.streaming}
    export = build_export(res.records, input_config=config,
                          run_info={"simulated": True, "clock": "virtual",
                                    "note": "mmdatagen simulator: a performance model",
                                    "embedding_cache": counters, "engine_steps": engine.steps})
    export["server_stages"] = engine.stages()
    if run.output_dir is not None:
        write_exports(Path(run.output_dir), res.records, export)
    return Study(export=export, cache=counters, profile=prof.name)


def _sweep(dataset: Path, prof: Profile, sizes: list[float], run: VirtualRun, kw: dict,
           shown: tuple[str, tuple[str, float] | None]) -> dict:
    """The what-if document: its rows (``sim.whatif``), the sizes' unit and the SLO
    (``shown``), the interval's method; with an output folder also written as ``sweep.json``."""
    import orjson

    from ..io.atomic import atomic_open
    from .virtual import load_turns
    from .whatif import METHOD, knee, slo_met, uncertainty, whatif

    kw = dict(kw)
    turns = load_turns(dataset, prof, kw.pop("model", None))
    rows = whatif(turns, prof, sizes, request_count=run.request_count or len(turns),
                  wrap=run.request_count is not None, **kw)
    doc = {"profile": prof.name, "dataset": str(dataset), "unit": shown[0],
           "interval": METHOD if uncertainty(prof) else None,
           "slo": list(shown[1]) if shown[1] else None, "knee": knee(rows),
           "slo_met": slo_met(rows, shown[1]), "rows": rows}
    if run.output_dir is not None:
        Path(run.output_dir).mkdir(parents=True, exist_ok=True)
        with atomic_open(Path(run.output_dir) / "sweep.json", "wb") as fh:
            fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return doc


def cache_line(cache: dict) -> str:
    q = max(1, cache["queries"])
    line = (f"embedding cache: {cache['hits']}/{cache['queries']} hits "
            f"({cache['hits'] / q:.1%}), {cache['evictions']} evictions, {cache['entries']} "
            "entries held (simulated)")
    if "encoder_hits" in cache:  # a two-tier target: what the front served never reached it
        line += (f"; {cache['encoder_hits']} served first by vLLM's encoder cache, "
                 f"{cache['encoder_runs']} encoder runs")
    return line
