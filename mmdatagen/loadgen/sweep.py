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

Resumable: a run whose export exists and is complete is read back, not run again, when the
folder's ``sweep.origin.json`` says it is the same sweep (dataset digest and every run setting:
``loadgen/resume.py``); a folder of another sweep needs ``--force``. Results:
``sweep.json`` (every run and the per-point summaries) and ``sweep.csv`` (one row per point and
repeat), then ``report.html``.
"""
from __future__ import annotations

import csv
import io
import itertools
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from .. import __version__
from ..errors import RunFailed, SpecError, UserError
from ..exportmodel import Export, GridValue, SweepDoc, SweepPoint
from ..metrics import EXPORT_NAME, RECORDS_NAME
from ..scheduling import slots_for
from ..settings.load import Load
from ..settings.report import ReportOutput
from ..settings.run import BenchRun
from ..settings.sweep import SweepGrid, SweepSearch, SweepTarget
from ..settings.values import list_items
from .run import failed_run
from .stats import summarize

if TYPE_CHECKING:
    from ..report.html import ReportFiles
    from ..sim.profile import Profile
    from .resume import Origin

Params = dict[str, GridValue]  # one grid point: parameter -> value
Log = Callable[[str], None]

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


def sweep_grid(grid: SweepGrid) -> dict[str, list[GridValue]]:
    """The spec's load axes, then one axis per ``--sim-param`` (a parameter not given is not
    swept)."""
    out: dict[str, list[GridValue]] = {k: list(v) for k, v in grid.axes().items()}
    out.update(parse_sim_params(grid.grid_sim_params))
    return out


def parse_sim_params(specs: Sequence[str]) -> dict[str, list[GridValue]]:
    """``["max_running=32,52"]`` -> ``{"max_running": [32, 52]}``; FIELD must be a profile
    field; values are ints, floats or words."""
    known = profile_fields()
    out: dict[str, list[GridValue]] = {}
    for text in specs:
        name, sep, vals = text.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise SpecError("grid_sim_params", f"takes FIELD=V1,V2 with FIELD a profile field "
                            f"({', '.join(sorted(known))}); got {text!r}")
        parsed = [_grid_value(v) for v in list_items(vals)]
        if not parsed:
            raise SpecError("grid_sim_params", f"{name} needs at least one value")
        out[name] = parsed
    return out


def _grid_value(text: str) -> GridValue:
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        return text  # e.g. key_mode=bytes,pixels


def check_sim_params(profile: str, grid: dict[str, list[GridValue]]) -> None:
    """Every ``--sim-param`` value through the profile's own checks (type, finiteness, range)
    before any run starts."""
    from ..sim.profile import load_profile

    base = load_profile(profile)
    for name, values in grid.items():
        if name in BENCH_PARAMS:
            continue
        for value in values:
            try:
                base.with_overrides(**profile_overrides({name: value}))
            except (UserError, TypeError) as exc:
                raise SpecError("grid_sim_params", f"{name}={value}: {exc}") from None


def profile_overrides(params: Params) -> dict[str, Any]:
    """A point's profile fields as the profile takes them (``640x480`` -> (640, 480))."""
    out: dict[str, Any] = {k: v for k, v in params.items() if k not in BENCH_PARAMS}
    size = out.get("default_image_size")
    if isinstance(size, str) and re.fullmatch(r"\d+x\d+", size):
        out["default_image_size"] = tuple(int(x) for x in size.split("x"))
    return out


_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def point_name(params: Params) -> str:
    """The point's folder name: one path component inside the sweep's folder, whatever the
    values (other characters become ``_``, and a hash of the point keeps names distinct)."""
    if not params:
        return "base"
    name = "_".join(f"{k}-{_text(v)}" for k, v in params.items())
    safe = _SAFE.sub("_", name)
    if safe != name or len(safe) > 120:
        import hashlib

        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:10]
        safe = f"{safe[:100]}~{digest}"
    return safe


def _text(v: GridValue) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class SweepConfig:
    """A sweep as its specs: the base of every run, the grid, where it runs and what it writes."""

    base: BenchRun  # every run's specs but the grid's, the seed and the folder (runs are quiet)
    grid: dict[str, list[GridValue]]
    repeats: int = 1
    target: SweepTarget = field(default_factory=SweepTarget)  # folder, virtual time, --force
    report: ReportOutput = field(default_factory=ReportOutput)
    quiet: bool = False  # the sweep's own progress lines and table
    search: SweepSearch | None = None  # --search rate: probes instead of the grid (search.py)

    def expand(self) -> list[Params]:
        keys = list(self.grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*self.grid.values())]

    def describe_target(self) -> str:
        if self.target.virtual:
            return "simulator in virtual time (fresh engine per run: cold cache)"
        if self.base.target.url:
            return f"{self.base.target.url} (server as it is: its cache is not reset between runs)"
        return "embedded simulator (fresh server per run: cold cache)"


def sweep_config(load: Load, grid: SweepGrid, target: SweepTarget, repeats: int, *,
                 goodput: tuple[str, ...] = (), report: ReportOutput | None = None,
                 search: SweepSearch | None = None) -> SweepConfig:
    """The specs resolved: every run's base (runs are quiet) and the grid."""
    from ..settings.cache import BenchCache
    from ..settings.load import BenchTarget
    from .setup import bench_run

    base = bench_run(load, BenchTarget(url=target.url, output_dir=Path(target.output_dir)),
                     BenchCache(), goodput=goodput)
    base = replace(base, load=replace(base.load, quiet=True),
                   cache=replace(base.cache, cache_size=base_cache_size(base)))
    return SweepConfig(base=base, grid=sweep_grid(grid), repeats=repeats, target=target,
                       report=report or ReportOutput(), quiet=load.quiet,
                       search=search if search is not None and search.search else None)


def base_cache_size(run: BenchRun) -> float:
    """The cache size of a sweep's runs where its grid does not sweep one: the default of the
    cache the runs size, in that cache's unit (the embedded simulator's target, ``--sim-arg``
    included; with a ``url``, the prediction's target). Written in every run's config."""
    from ..caches import get_target
    from ..sim.study import simulator_target

    target = (get_target(run.cache.target_name) if run.target.url
              else simulator_target(run.simulator()))
    return float(target.resolve(run.cache.cache_size))


def _validate(cfg: SweepConfig) -> None:
    if cfg.repeats < 1:
        raise SpecError("repeats", "must be at least 1")
    load, url = cfg.base.load, cfg.base.target.url
    if not Path(load.input_file).is_file():
        raise UserError(f"input file not found: {load.input_file}")
    sim_fields = [k for k in cfg.grid if k not in BENCH_PARAMS]
    if url and (sim_fields or "cache_gb" in cfg.grid):
        raise SpecError("url", "is your server: sweep `cache_size` and `grid_sim_params` only "
                        "on the simulator (no `url`)")
    if cfg.target.virtual and url:
        raise SpecError("virtual", "runs the simulator's model; it takes no `url`")
    if cfg.target.virtual and load.fixed_schedule:
        raise SpecError("virtual", "does not model `fixed_schedule`")
    if cfg.target.virtual:  # the simulator's reading of them, before any run starts
        from ..sim.study import output_policy

        output_policy(load.extras)
    check_sim_params(load.profile, cfg.grid)
    if cfg.search is not None:
        from .search import check_search

        check_search(cfg.search, cfg.base, cfg.grid)


def _profile_for(cfg: SweepConfig, params: Params) -> tuple[Profile, str]:
    """The point's simulator profile, and how runs name it (a derived YAML when fields vary)."""
    from ..sim.profile import load_profile

    over = profile_overrides(params)
    prof = load_profile(cfg.base.load.profile)
    if not over:
        return prof, cfg.base.load.profile
    from dataclasses import asdict

    import yaml

    from ..io.atomic import atomic_write_bytes
    try:
        derived = prof.with_overrides(**over)
    except TypeError as exc:
        raise SpecError("grid_sim_params", str(exc)) from None
    data = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(derived).items()
            if k not in ("name", "calibration")}
    data["description"] = f"{prof.name} with {over} (mmdatagen sweep)"
    path = Path(cfg.target.output_dir) / "profiles" / f"{point_name(params)}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, yaml.safe_dump(data, sort_keys=False).encode())
    return derived, str(path)


def point_run(base: BenchRun, params: Params, repeat: int, run_dir: Path, profile_ref: str
              ) -> BenchRun:
    """One run of a point: the base with the point's values, the repeat's seed, its folder."""
    ld = base.load
    c, rate, size = (params.get(k) for k in BENCH_PARAMS)  # numbers, as SweepGrid parsed them
    load = replace(ld, concurrency=c if isinstance(c, int) else ld.concurrency,
                   request_rate=rate if isinstance(rate, (int, float)) else ld.request_rate,
                   seed=ld.seed + repeat, profile=profile_ref, quiet=True)
    cache = base.cache if not isinstance(size, (int, float)) else \
        replace(base.cache, cache_size=size)
    return replace(base, load=load, cache=cache, target=replace(base.target, output_dir=run_dir))


def _load_done(run_dir: Path) -> Export | None:
    p = run_dir / EXPORT_NAME
    if not p.is_file():
        return None
    try:
        doc = orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    from .compare import export_problem

    if export_problem(doc) is not None or doc.get("was_cancelled") \
            or not doc.get("is_complete", True):
        return None  # not a whole, well-formed export: run again
    return doc


def _capacity(prof: Profile, cache_size: float | None) -> float:
    """The cache size a run uses: the given one, else the profile's cache target's default."""
    return prof.cache_target().resolve(cache_size)


def run_virtual(run: BenchRun, prof: Profile, predicted: dict[str, Any] | None) -> Export:
    """One run in virtual time: the simulator's engine, exports written like ``bench``'s."""
    from ..export import build_export, write_exports
    from ..report.aggregate import run_aggregates
    from ..sim.study import output_policy
    from ..sim.virtual import run_simulation
    from .goodput import export_goodput

    ld = run.load
    policy = output_policy(ld.extras)
    concurrency = slots_for(ld.concurrency, ld.request_rate)
    res = run_simulation(Path(ld.input_file), prof, _capacity(prof, run.cache.cache_size),
                         concurrency, ld.request_count, ld.warmup_request_count, policy,
                         ld.streaming, ld.request_rate, ld.arrival, ld.seed,
                         burstiness=ld.burstiness, ramp_to=ld.ramp_to)
    assert res.engine is not None, "run_simulation returns its engine"
    config = run.public()
    config["mode"] = "virtual"
    export = build_export(res.records, input_config=config,
                          run_info={"simulated": True, "clock": "virtual",
                                    "note": "mmdatagen simulator: a performance model",
                                    "embedding_cache": res.engine.cache.counters()},
                          predicted=predicted)
    export["server_stages"] = res.engine.stages()
    if run.slos:
        export.update(export_goodput(res.records, export, dict(run.slos)))
    export.update(run_aggregates(res.records))
    write_exports(Path(run.target.output_dir), res.records, export)
    return export


class _Predictions:
    """Virtual runs: the analysis' exact prediction for one pass over the dataset in the order
    the dispatch core starts it (``analyze --dispatch sessions --in-flight N``: the run's slots
    replaying sessions, completions first-in first-out), one per (cache, model, size, slots);
    the dataset's trace read once per cache key."""

    def __init__(self, dataset: Path) -> None:
        self.dataset = dataset
        self.traces: dict[str, Any] = {}
        self.done: dict[tuple[object, ...], dict[str, Any]] = {}

    def get(self, prof: Profile, cache_size: float | None, slots: int) -> dict[str, Any]:
        target = prof.cache_target()
        size = _capacity(prof, cache_size)
        key = (target.name, target.key, target.present, prof.model, size, slots)
        if key not in self.done:
            self.done[key] = self._predict(prof, size, slots)
        return self.done[key]

    def _predict(self, prof: Profile, cache_size: float, slots: int) -> dict[str, Any]:
        from ..analysis.predict import Semantics, analyze
        from ..analysis.trace import trace_from_dataset
        from ..caches.entries import front_budget
        from ..vlm import resolve_model

        target = prof.cache_target()
        if target.key not in self.traces:
            self.traces[target.key] = trace_from_dataset(self.dataset, key_mode=target.key)
        insert = "schedule" if target.insert_on_lookup else "completion"
        model = resolve_model(prof.model)
        budget = front_budget(target, model, prof.encoder_budget, prof.token_budget)
        a = analyze(self.traces[target.key], model,
                    Semantics(target=target.name, oversize=target.oversize, insert=insert,
                              encoder_budget=budget, in_flight=slots, dispatch="sessions",
                              orders=1),
                    cache_bytes=[target.capacity(cache_size)], want_curve=False)
        c = a.summary["capacities"][0]
        return {"references": a.summary["references"], "hits": c["hits"],
                "misses": a.summary["references"] - c["hits"], "hit_rate": c["hit_rate"],
                "model": prof.model, "cache_gb": cache_size,
                "order": f"the dispatch core's: {slots} slots replaying sessions, completions "
                         "first-in first-out (mmdatagen analyze --dispatch sessions "
                         f"--in-flight {slots})",
                "note": "one pass over the dataset, warmup not counted separately"}


def row_of(export: Export) -> dict[str, Any]:
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


@dataclass
class SweepResult:
    """The sweep document (as in ``sweep.json``) and the files written."""

    doc: SweepDoc
    json: Path
    csv: Path
    report: ReportFiles | None = None
    failed: list[str] = field(default_factory=list)  # runs whose every request failed

    def check(self) -> None:
        """Once the results are shown: a sweep with a run whose every request failed failed
        (exit 1), like ``bench`` (``run.failed_run``)."""
        if self.failed:
            more = f" (and {len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
            raise RunFailed(f"{self.failed[0]}{more}; results in {self.json.parent}")


def run_sweep(cfg: SweepConfig, log: Log | None = None) -> SweepResult:
    """Run (or resume) every point and repeat; write sweep.json, sweep.csv (and the report)."""
    from ..io.atomic import writing

    _validate(cfg)
    out = Path(cfg.target.output_dir)
    with writing(out, sweep_outputs(cfg), [cfg.base.load.input_file]):  # one sweep per folder
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create {out}: {exc.strerror}") from None
        from .resume import Origin

        origin = Origin(cfg.base, cfg.target.virtual, cfg.target.force, out)  # the same sweep
        return _sweep(cfg, out, log, origin)


def sweep_outputs(cfg: SweepConfig) -> list[Path]:
    """Every path a sweep writes: its summaries and report, each point's derived profile and
    each run's files (none may be an input of the sweep)."""
    from ..report.html import PLOTS_DIR, REPORT_NAME
    from .run import run_outputs

    out = Path(cfg.target.output_dir)
    from .resume import ORIGIN_NAME
    from .search import SEARCH_CSV

    paths = [out / name for name in (SWEEP_JSON, SWEEP_CSV, REPORT_NAME, PLOTS_DIR, ORIGIN_NAME,
                                     SEARCH_CSV)]
    for params in cfg.expand() if cfg.search is None else ():  # a search's probes: as they run
        paths.append(out / "profiles" / f"{point_name(params)}.yaml")
        for r in range(1, cfg.repeats + 1):
            paths.extend(run_outputs(out / point_name(params) / f"r{r}"))
    return paths


def _sweep(cfg: SweepConfig, out: Path, log: Log | None, origin: Origin) -> SweepResult:
    runner = _Runner(cfg, out, log or _stderr_log(cfg.quiet), origin)
    if cfg.search is not None:
        from .search import run_search

        points, grid, search = run_search(cfg.search, dict(cfg.base.slos), cfg.grid,
                                          runner.point, runner.log)
        doc = sweep_document(cfg, points)
        doc["grid"], doc["search"] = grid, search
    else:
        doc = sweep_document(cfg, [runner.point(params) for params in cfg.expand()])
    result = _write(cfg, out, doc, runner.representatives)
    result.failed = runner.failed
    return result


def _stderr_log(quiet: bool) -> Log:
    def log(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)
    return log


class _Runner:
    """Runs (or reads back) each point's repeats, numbering them across the sweep."""

    def __init__(self, cfg: SweepConfig, out: Path, log: Log, origin: Origin) -> None:
        self.cfg, self.out, self.log = cfg, out, log
        self.origin = origin  # which of the folder's runs this very sweep made
        self.total = len(cfg.expand()) * cfg.repeats if cfg.search is None else 0  # 0: unknown
        self.done = 0
        self.predictions = _Predictions(Path(cfg.base.load.input_file))
        self.representatives: dict[str, Export] = {}  # point -> its first repeat's export
        self.metrics_noted = False  # "server metrics not collected" is said once per sweep
        self.failed: list[str] = []  # runs whose every request failed

    def point(self, params: Params) -> SweepPoint:
        """Every repeat of one point, and the summary of each metric over them."""
        name = point_name(params)
        prof, prof_ref = _profile_for(self.cfg, params)
        runs = [self.repeat(name, params, r, prof, prof_ref)
                for r in range(1, self.cfg.repeats + 1)]
        summary = {m: summarize([run[m] for run in runs]) for m in METRIC_NAMES}
        return {"name": name, "params": params, "runs": runs, "summary": summary}

    def repeat(self, name: str, params: Params, r: int, prof: Profile, prof_ref: str
               ) -> dict[str, Any]:
        """Repeat ``r`` of a point: its export read back when complete, else run."""
        self.done += 1
        run_dir = self.out / name / f"r{r}"
        run = point_run(self.cfg.base, params, r - 1, run_dir, prof_ref)
        tag = f"[{self.done}{f'/{self.total}' if self.total else ''}] {name} repeat {r}"
        export = self._resume(run_dir, tag)
        resumed = export is not None
        if export is None:
            self.log(f"{tag}: running")
            export = self._run(run, prof, f"{name} repeat {r}")
            self.origin.done(f"{name}/r{r}")
        self._note_metrics(export)
        problem = failed_run(export)
        if problem is not None:
            self.failed.append(f"{name} repeat {r}: {problem}")
        if r == 1:
            self.representatives[name] = export
        return {"repeat": r, "dir": str(run_dir), "resumed": resumed, "seed": run.load.seed,
                **row_of(export)}

    def _resume(self, run_dir: Path, tag: str) -> Export | None:
        """A complete export already there (goodput recomputed when the objectives changed)."""
        run = f"{run_dir.parent.name}/{run_dir.name}"
        export = _load_done(run_dir) if self.origin.resumable(run) else None
        if export is None:
            return None
        self.log(f"{tag}: export exists, not run again")
        slos = dict(self.cfg.base.slos)
        if slos and (export.get("goodput") or {}).get("slos") != slos:
            from .goodput import goodput_from_records_file

            gp = goodput_from_records_file(run_dir / RECORDS_NAME, export, slos)
            if gp is not None:
                export.update(gp)
        return export

    def _run(self, run: BenchRun, prof: Profile, what: str) -> Export:
        if self.cfg.target.virtual:
            ld = run.load
            predicted = None if ld.no_predict else self.predictions.get(
                prof, run.cache.cache_size, slots_for(ld.concurrency, ld.request_rate))
            return run_virtual(run, prof, predicted)
        from .run import finish_run, run_bench

        result = run_bench(run)
        if result.stopped_by is not None:
            self.log(f"{what} stopped; partial exports in {run.target.output_dir} (run the "
                     "sweep again to resume)")
            finish_run(result, what)  # exit 143 / 130, as every command
        return result.export

    def _note_metrics(self, export: Export) -> None:
        series = export.get("server_metrics_timeseries")
        if isinstance(series, dict) and not series.get("available") and not self.metrics_noted:
            self.metrics_noted = True
            self.log(f"note: server metrics not collected: {series.get('reason')}")


def sweep_document(cfg: SweepConfig, points: list[SweepPoint]) -> SweepDoc:
    """``sweep.json``: the setting, then every point with its runs and summaries."""
    return {"mmdatagen_version": __version__, "dataset": str(cfg.base.load.input_file),
            "target": cfg.describe_target(), "grid": cfg.grid, "repeats": cfg.repeats,
            "goodput_slos": dict(cfg.base.slos) or None,
            "statistics": "mean over repeats; 95 % confidence interval of the mean with "
                          "Student's t (n-1 degrees of freedom); std is the sample standard "
                          "deviation",
            "base_config": cfg.base.public(), "points": points}


def _write(cfg: SweepConfig, out: Path, doc: SweepDoc,
           representatives: dict[str, Export]) -> SweepResult:
    from ..io.atomic import atomic_write_bytes

    res = SweepResult(doc, out / SWEEP_JSON, out / SWEEP_CSV)
    atomic_write_bytes(res.json, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    atomic_write_bytes(res.csv, to_csv(doc).encode())
    if "search" in doc:
        from .search import SEARCH_CSV, search_csv

        atomic_write_bytes(out / SEARCH_CSV, search_csv(doc).encode())
    if not cfg.report.no_report:
        from ..report.html import sweep_report

        res.report = sweep_report(doc, representatives).write(out, png=cfg.report.png)
    return res


def to_csv(doc: SweepDoc) -> str:
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


def sweep_table(doc: SweepDoc) -> str:
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
