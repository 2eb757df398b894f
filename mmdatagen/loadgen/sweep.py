"""``mmdatagen sweep``: one dataset, a grid of points, each repeated; means with 95 % CIs.

The grid is the cartesian product of the values given for ``concurrency``, ``request_rate``,
``cache_gb`` and any simulator profile field (``max_running``, ``token_budget``, ...). Each
(point, repeat) is one ordinary benchmark, run by :func:`mmdatagen.loadgen.run.run_bench`, into
``<output>/<point>/r<k>/`` (its export, records and report beside it). Targets:

- the embedded simulator (no ``--url``): a fresh server per run, so every run starts with a cold
  cache;
- ``--url``: the user's server, as it is (its cache is NOT reset between runs: warm after the
  first);
- ``virtual``: the simulator's model in virtual time (``mmdatagen simulate``'s engine; a fresh
  engine, cold cache, per run), seconds instead of minutes.

Resumable: a run whose export exists and is complete is read back, not run again. Results:
``sweep.json`` (every run and the per-point summaries) and ``sweep.csv`` (one row per point and
repeat), then ``report.html``.
"""
from __future__ import annotations

import csv
import io
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import orjson

from .. import __version__
from ..errors import UserError
from ..metrics import EXPORT_NAME, RECORDS_NAME
from .run import BenchConfig
from .stats import summarize

BENCH_PARAMS = ("concurrency", "request_rate", "cache_gb")
SWEEP_JSON, SWEEP_CSV = "sweep.json", "sweep.csv"

# per-run row: name -> (export tag, statistic)
ROW_METRICS: dict[str, tuple[str, str]] = {
    "output_token_throughput": ("output_token_throughput", "avg"),
    "request_throughput": ("request_throughput", "avg"),
    "ttft_avg": ("time_to_first_token", "avg"),
    "ttft_p50": ("time_to_first_token", "p50"),
    "ttft_p99": ("time_to_first_token", "p99"),
    "itl_avg": ("inter_token_latency", "avg"),
    "itl_p50": ("inter_token_latency", "p50"),
    "itl_p99": ("inter_token_latency", "p99"),
    "latency_avg": ("request_latency", "avg"),
    "latency_p99": ("request_latency", "p99"),
    "goodput": ("goodput", "avg"),
    "good_request_count": ("good_request_count", "avg"),
    "request_count": ("request_count", "avg"),
    "error_count": ("error_request_count", "avg"),
    "benchmark_duration": ("benchmark_duration", "avg"),
}
METRIC_NAMES = (*ROW_METRICS, "hit_rate", "predicted_hit_rate")


def profile_fields() -> set[str]:
    from ..sim.profile import Profile

    return {f.name for f in fields(Profile)} - {"name", "description", "calibration",
                                                "served_model_name", "model"}


def parse_grid(concurrency: str | None, request_rate: str | None, cache_gb: str | None,
               sim_params: tuple[str, ...] | list[str] = ()) -> dict[str, list]:
    """Comma lists -> ``{param: [values]}`` (a parameter not given is not swept)."""
    grid: dict[str, list] = {}

    def nums(name: str, text: str, cast: Callable) -> list:
        try:
            vals = [cast(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--{name.replace('_', '-')} takes comma-separated numbers, got "
                            f"{text!r}") from None
        if not vals:
            raise UserError(f"--{name.replace('_', '-')} needs at least one value")
        if len(set(vals)) != len(vals):
            raise UserError(f"--{name.replace('_', '-')} repeats a value: {text}")
        return vals

    if concurrency:
        grid["concurrency"] = nums("concurrency", concurrency, int)
        if any(v < 1 for v in grid["concurrency"]):
            raise UserError("--concurrency values must be at least 1")
    if request_rate:
        grid["request_rate"] = nums("request_rate", request_rate, float)
        if any(v <= 0 for v in grid["request_rate"]):
            raise UserError("--request-rate values must be positive")
    if cache_gb:
        grid["cache_gb"] = nums("cache_gb", cache_gb, float)
        if any(v < 0 for v in grid["cache_gb"]):
            raise UserError("--cache-gb values must not be negative")
    known = profile_fields()
    for spec in sim_params:
        name, sep, vals = spec.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise UserError(f"--sim-param takes FIELD=V1,V2 with FIELD a profile field "
                            f"({', '.join(sorted(known))}); got {spec!r}")
        parsed = []
        for v in vals.split(","):
            v = v.strip()
            if not v:
                continue
            try:
                parsed.append(int(v) if v.lstrip("-").isdigit() else float(v))
            except ValueError:
                parsed.append(v)  # e.g. key_mode=bytes,pixels
        if not parsed:
            raise UserError(f"--sim-param {name} needs at least one value")
        grid[name] = parsed
    return grid


def point_name(params: dict[str, Any]) -> str:
    if not params:
        return "base"
    return "_".join(f"{k}-{v:g}" if isinstance(v, float) else f"{k}-{v}"
                    for k, v in params.items())


@dataclass
class SweepConfig:
    base: BenchConfig
    grid: dict[str, list]
    repeats: int = 1
    output_dir: Path = Path("artifacts/sweep")
    virtual: bool = False
    report: bool = True
    png: bool = False
    quiet: bool = False
    points: list[dict] = field(default_factory=list)

    def expand(self) -> list[dict[str, Any]]:
        keys = list(self.grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*self.grid.values())]

    def target(self) -> str:
        if self.virtual:
            return "simulator in virtual time (fresh engine per run: cold cache)"
        if self.base.url:
            return f"{self.base.url} (server as it is: its cache is not reset between runs)"
        return "embedded simulator (fresh server per run: cold cache)"


def _validate(cfg: SweepConfig) -> None:
    if cfg.repeats < 1:
        raise UserError("--repeats must be at least 1")
    if not Path(cfg.base.input_file).is_file():
        raise UserError(f"input file not found: {cfg.base.input_file}")
    sim_fields = [k for k in cfg.grid if k not in BENCH_PARAMS]
    if cfg.base.url and (sim_fields or "cache_gb" in cfg.grid):
        raise UserError("with --url the server is yours: sweep --cache-gb and --sim-param only "
                        "on the simulator (no --url)")
    if cfg.virtual and cfg.base.url:
        raise UserError("--virtual runs the simulator's model; it takes no --url")
    if cfg.virtual and cfg.base.fixed_schedule:
        raise UserError("--virtual does not model --fixed-schedule")


def _profile_for(cfg: SweepConfig, params: dict[str, Any]):
    from ..sim.profile import load_profile

    over = {k: v for k, v in params.items() if k not in BENCH_PARAMS}
    prof = load_profile(cfg.base.profile)
    if not over:
        return prof, cfg.base.profile
    from dataclasses import asdict

    import yaml

    from ..io.atomic import atomic_write_bytes
    try:
        derived = replace(prof, **over).validate()
    except TypeError as exc:
        raise UserError(f"--sim-param: {exc}") from None
    data = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(derived).items()
            if k not in ("name", "calibration")}
    data["description"] = f"{prof.name} with {over} (mmdatagen sweep)"
    path = Path(cfg.output_dir) / "profiles" / f"{point_name(params)}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, yaml.safe_dump(data, sort_keys=False).encode())
    return derived, str(path)


def _run_config(cfg: SweepConfig, params: dict[str, Any], repeat: int, run_dir: Path,
                profile_ref: str) -> BenchConfig:
    b = cfg.base
    return replace(b, concurrency=params.get("concurrency", b.concurrency),
                   request_rate=params.get("request_rate", b.request_rate),
                   cache_gb=params.get("cache_gb", b.cache_gb), seed=b.seed + repeat,
                   output_dir=run_dir, profile=profile_ref, quiet=True)


def _load_done(run_dir: Path) -> dict | None:
    p = run_dir / EXPORT_NAME
    if not p.is_file():
        return None
    try:
        doc = orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("was_cancelled") or not doc.get("is_complete", True):
        return None
    return doc


def run_virtual(bc: BenchConfig, prof, predicted: dict | None) -> dict:
    """One run in virtual time: the simulator's engine, exports written like ``bench``'s."""
    from ..metrics import build_export, write_exports
    from ..report.aggregate import run_aggregates
    from ..sim.virtual import OutputPolicy, run_simulation
    from .goodput import export_goodput

    extra = bc.extra_inputs
    mx = extra.get("max_completion_tokens") or extra.get("max_tokens")
    policy = OutputPolicy(int(mx) if mx else None, int(extra.get("min_tokens") or 0),
                          bool(extra.get("ignore_eos", False)))
    concurrency = bc.concurrency or (1024 if bc.request_rate else 1)
    res = run_simulation(Path(bc.input_file), prof, bc.cache_gb, concurrency, bc.request_count,
                         bc.warmup_request_count, policy, bc.streaming, bc.request_rate,
                         bc.arrival, bc.seed)
    config = bc.public()
    config["mode"] = "virtual"
    export = build_export(res.records, input_config=config,
                          run_info={"simulated": True, "clock": "virtual",
                                    "note": "mmdatagen simulator: a performance model",
                                    "embedding_cache": res.engine.cache.counters()},
                          predicted=predicted)
    if bc.goodput:
        export.update(export_goodput(res.records, export, bc.goodput))
    export.update(run_aggregates(res.records))
    write_exports(Path(bc.output_dir), res.records, export)
    return export


def _dataset_prediction(cfg: SweepConfig, prof, cache_gb: float, memo: dict) -> dict | None:
    """Virtual runs: the analysis' exact LRU prediction for the dataset in file order."""
    if not cfg.base.predict:
        return None
    target = prof.cache_target()
    if cache_gb is None:
        cache_gb = target.default_capacity
    key = (target.name, target.key, target.present, prof.model, cache_gb)
    if key in memo:
        return memo[key]
    from ..analysis.predict import Semantics, analyze
    from ..analysis.trace import trace_from_dataset
    from ..vlm import resolve_model

    tkey = (target.key,)
    if tkey not in memo:
        memo[tkey] = trace_from_dataset(Path(cfg.base.input_file), key_mode=target.key)
    trace = memo[tkey]
    insert = "schedule" if target.insert_on_lookup else "completion"
    a = analyze(trace, resolve_model(prof.model),
                Semantics(target=target.name, oversize=target.oversize, insert=insert),
                cache_bytes=[target.capacity(cache_gb)], want_curve=False)
    c = a.summary["capacities"][0]
    memo[key] = {"references": a.summary["references"], "hits": c["hits"],
                 "misses": a.summary["references"] - c["hits"], "hit_rate": c["hit_rate"],
                 "model": prof.model, "cache_gb": cache_gb,
                 "order": "dataset file order (mmdatagen analyze)",
                 "note": "one pass in file order, warmup not counted separately"}
    return memo[key]


def row_of(export: dict) -> dict[str, Any]:
    """The sweep's per-run numbers from an export."""
    row: dict[str, Any] = {}
    for name, (tag, stat) in ROW_METRICS.items():
        b = export.get(tag)
        row[name] = b.get(stat) if isinstance(b, dict) else None
    cache = export.get("image_cache") or {}
    meas = (cache.get("measured") or {}).get("hit_rate")
    if meas is None:
        meas = (cache.get("server_metrics") or {}).get("hit_rate")
    row["hit_rate"] = meas
    row["predicted_hit_rate"] = (cache.get("predicted") or {}).get("hit_rate")
    return row


def run_sweep(cfg: SweepConfig, log: Callable[[str], None] | None = None) -> dict:
    """Run (or resume) every point and repeat; write sweep.json, sweep.csv (and the report)."""
    from ..io.atomic import atomic_write_bytes
    from .run import run_bench

    _validate(cfg)
    out = Path(cfg.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {out}: {exc.strerror}") from None
    log = log or (lambda s: None if cfg.quiet else print(s, file=sys.stderr, flush=True))
    points = cfg.expand()
    total = len(points) * cfg.repeats
    memo: dict = {}
    doc_points = []
    reps: dict[str, dict] = {}
    no_metrics: list[str] = []  # said once per sweep
    k = 0
    for params in points:
        name = point_name(params)
        prof, prof_ref = _profile_for(cfg, params)
        runs = []
        for r in range(1, cfg.repeats + 1):
            k += 1
            run_dir = out / name / f"r{r}"
            bc = _run_config(cfg, params, r - 1, run_dir, prof_ref)
            export = _load_done(run_dir)
            resumed = export is not None
            if resumed:
                log(f"[{k}/{total}] {name} repeat {r}: export exists, not run again")
                if cfg.base.goodput and (export.get("goodput") or {}).get("slos") != cfg.base.goodput:
                    from .goodput import goodput_from_records_file

                    gp = goodput_from_records_file(run_dir / RECORDS_NAME, export,
                                                   cfg.base.goodput)
                    if gp is not None:
                        export.update(gp)
            else:
                log(f"[{k}/{total}] {name} repeat {r}: running")
                if cfg.virtual:
                    export = run_virtual(bc, prof, _dataset_prediction(cfg, prof, bc.cache_gb,
                                                                        memo))
                else:
                    result = run_bench(bc)
                    export = result.export
                    if export.get("was_cancelled"):
                        raise UserError(f"{name} repeat {r} was interrupted; partial exports in "
                                        f"{run_dir} (run the sweep again to resume)")
            series = export.get("server_metrics_timeseries")
            if isinstance(series, dict) and not series.get("available") and not no_metrics:
                no_metrics.append(series.get("reason"))
                log(f"note: server metrics not collected: {series.get('reason')}")
            if r == 1:
                reps[name] = export
            runs.append({"repeat": r, "dir": str(run_dir), "resumed": resumed, "seed": bc.seed,
                         **row_of(export)})
        summary = {m: summarize([run[m] for run in runs]) for m in METRIC_NAMES}
        doc_points.append({"name": name, "params": params, "runs": runs, "summary": summary})
    doc = {"mmdatagen_version": __version__, "dataset": str(cfg.base.input_file),
           "target": cfg.target(), "grid": cfg.grid, "repeats": cfg.repeats,
           "goodput_slos": cfg.base.goodput or None,
           "statistics": "mean over repeats; 95 % confidence interval of the mean with Student's "
                         "t (n-1 degrees of freedom); std is the sample standard deviation",
           "base_config": cfg.base.public(), "points": doc_points}
    atomic_write_bytes(out / SWEEP_JSON, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    atomic_write_bytes(out / SWEEP_CSV, to_csv(doc).encode())
    paths: dict[str, Any] = {"json": out / SWEEP_JSON, "csv": out / SWEEP_CSV}
    if cfg.report:
        from ..report.html import sweep_report

        paths["report"] = sweep_report(doc, reps).write(out, png=cfg.png)
    doc["_paths"] = paths
    return doc


def to_csv(doc: dict) -> str:
    params = list(doc["grid"])
    head = ["point", *params, "repeat", *METRIC_NAMES, "resumed", "export_dir"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for p in doc["points"]:
        for run in p["runs"]:
            w.writerow([p["name"], *[p["params"].get(k) for k in params], run["repeat"],
                        *["" if run[m] is None else run[m] for m in METRIC_NAMES],
                        run["resumed"], run["dir"]])
    return buf.getvalue()


TABLE_COLS = (("output_token_throughput", "Output TPS", 1), ("ttft_p50", "TTFT p50 ms", 1),
              ("ttft_p99", "TTFT p99 ms", 1), ("itl_avg", "ITL avg ms", 2),
              ("hit_rate", "Hit rate %", 1), ("goodput", "Goodput req/s", 2))


def sweep_table(doc: dict) -> str:
    """Console table: per point, mean ± 95 % CI half-width of the headline metrics."""
    params = list(doc["grid"])
    cols = [c for c in TABLE_COLS
            if any(p["summary"][c[0]]["mean"] is not None for p in doc["points"])]
    head = [*params, *[c[1] for c in cols]]
    body = []
    for p in doc["points"]:
        cells = [f"{p['params'][k]:g}" if isinstance(p["params"][k], float) else
                 str(p["params"][k]) for k in params]
        for key, _, d in cols:
            s = p["summary"][key]
            scale = 100.0 if key == "hit_rate" else 1.0
            if s["mean"] is None:
                cells.append("-")
                continue
            txt = f"{s['mean'] * scale:,.{d}f}"
            if s["ci95_half"] is not None:
                txt += f" ± {s['ci95_half'] * scale:,.{d}f}"
            cells.append(txt)
        body.append(cells)
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    n = doc["repeats"]
    lines.append(f"(mean ± 95 % CI half-width over {n} repeat{'s' if n != 1 else ''}; "
                 f"target: {doc['target']})")
    return "\n".join(lines)
