"""``mmdatagen bench`` (the loader), ``mmdatagen ab`` (two runs on the simulator) and ``compare``."""
from __future__ import annotations

from pathlib import Path

import click
import orjson

from ..errors import UserError
from .sweep import goodput_option, report_options, write_report

DEFAULT_PROFILE = "qwen3-vl-30b-gb200"
SEED_A_EXTRA = ("max_tokens:150", "min_tokens:150", "ignore_eos:true")


def _common_options(f):
    opts = [
        click.option("--input-file", required=True, type=click.Path(path_type=Path),
                     help="AIPerf custom dataset JSONL (.gz accepted)."),
        click.option("--custom-dataset-type", "dataset_type", default="auto", show_default=True,
                     type=click.Choice(["auto", "single_turn", "multi_turn", "random_pool"]),
                     help="Dataset format; auto tells single_turn from multi_turn."),
        click.option("-m", "--model", "--model-names", "model", default=None,
                     help="Model name sent in the body (default with the simulator: its model)."),
        click.option("--concurrency", type=int, default=None,
                     help="Sessions in flight (bench default 1, ab default 64; with "
                          "--request-rate: a cap, default 1024)."),
        click.option("--request-count", type=int, default=None,
                     help="Profiling requests (default: one pass over the dataset)."),
        click.option("--warmup-request-count", type=int, default=None,
                     help="Warmup requests (bench default 0, ab default 3)."),
        click.option("--extra-inputs", multiple=True,
                     help="KEY:VALUE merged into every body (values coerced); repeatable. "
                          "ab default: seed A's max_tokens:150 min_tokens:150 ignore_eos:true."),
        click.option("--streaming/--no-streaming", default=None,
                     help="Stream (SSE). Default: off for bench, on for ab."),
        click.option("--request-rate", type=float, default=None, help="Requests per second."),
        click.option("--arrival", "--arrival-pattern", "arrival",
                     type=click.Choice(["poisson", "constant"]), default="poisson",
                     show_default=True, help="Arrival process with --request-rate."),
        click.option("--fixed-schedule", is_flag=True,
                     help="Send each row at its 'timestamp' (ms after the first row's)."),
        click.option("--benchmark-duration", type=float, default=None,
                     help="Stop issuing after this many seconds of profiling (dataset repeats)."),
        click.option("--request-timeout", "--request-timeout-seconds", "request_timeout",
                     type=float, default=600.0, show_default=True),
        click.option("-H", "--header", "headers", multiple=True, help="K:V request header; repeatable."),
        click.option("--api-key", envvar="MMDATAGEN_API_KEY", default=None,
                     show_envvar=True, help="Sent as a Bearer token; never written to exports."),
        click.option("--endpoint-type", type=click.Choice(["chat", "completions"]), default="chat",
                     show_default=True),
        click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
                     help="Simulator profile when no --url is given."),
        click.option("--time-scale", type=float, default=1.0, show_default=True,
                     help="Simulator time scale (no --url)."),
        click.option("--sim-arg", "sim_args", multiple=True,
                     help="Extra argument passed to the embedded 'mmdatagen serve'; repeatable."),
        click.option("--http-client", type=click.Choice(["raw", "aiohttp"]), default="raw",
                     show_default=True, help="raw asyncio HTTP/1.1 (fastest) or aiohttp."),
        click.option("--max-response-mb", type=float, default=64.0, show_default=True,
                     help="Largest response read (MiB); a larger one fails as ResponseTooLarge."),
        click.option("--grace-period", "--benchmark-grace-period", "grace_period", type=float,
                     default=30.0, show_default=True,
                     help="Seconds to let in-flight requests finish after Ctrl-C."),
        click.option("--random-seed", "seed", type=int, default=0, show_default=True),
        click.option("--no-predict", is_flag=True, help="Skip the predicted cache hits."),
        click.option("-q", "--quiet", is_flag=True, help="No progress bar and no table."),
        click.option("--metrics-interval", type=float, default=1.0, show_default=True,
                     help="Seconds between the server's /metrics scrapes during the run."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return report_options(goodput_option(f))


def _config(kw: dict, *, url: str | None, cache_gb: float, output_dir: Path):
    from ..loadgen.payload import parse_extra_inputs, parse_headers
    from ..loadgen.run import BenchConfig

    model = kw["model"]
    if model is None:
        if url:
            raise UserError("--model is required with --url")
        from ..sim.profile import load_profile

        model = load_profile(kw["profile"]).served_model_name
    if cache_gb < 0:
        raise UserError("--cache-gb must not be negative")
    if kw["streaming"] is None:
        kw["streaming"] = False
    if kw["warmup_request_count"] is None:
        kw["warmup_request_count"] = 0
    return BenchConfig(
        input_file=kw["input_file"], model=model, url=url, dataset_type=kw["dataset_type"],
        concurrency=kw["concurrency"], request_count=kw["request_count"],
        warmup_request_count=kw["warmup_request_count"],
        extra_inputs=parse_extra_inputs(kw["extra_inputs"]), streaming=kw["streaming"],
        output_dir=output_dir, request_rate=kw["request_rate"], arrival=kw["arrival"],
        benchmark_duration=kw["benchmark_duration"], request_timeout=kw["request_timeout"],
        headers=parse_headers(kw["headers"]), api_key=kw["api_key"],
        endpoint_type=kw["endpoint_type"], profile=kw["profile"], cache_gb=cache_gb,
        sim_args=list(kw["sim_args"]), time_scale=kw["time_scale"],
        http_client=kw["http_client"], grace_period=kw["grace_period"], seed=kw["seed"],
        quiet=kw["quiet"], predict=not kw["no_predict"], fixed_schedule=kw["fixed_schedule"],
        goodput=_slos(kw), metrics_interval=_interval(kw),
        max_response_bytes=_mib(kw["max_response_mb"]))


def _slos(kw: dict) -> dict[str, float]:
    from ..loadgen.goodput import parse_slos

    return parse_slos(kw.get("goodput"))


def _interval(kw: dict) -> float:
    v = kw.get("metrics_interval", 1.0)
    if v <= 0:
        raise UserError("--metrics-interval must be positive")
    return v


def _mib(value: float) -> int:
    import math

    if not math.isfinite(value) or value <= 0:
        raise UserError("--max-response-mb must be a positive number")
    return int(value * (1 << 20))


@click.command()
@_common_options
@click.option("--url", default=None, help="Server base URL; omit to run the embedded simulator.")
@click.option("--cache-gb", type=float, default=10.0, show_default=True,
              help="Embedding cache GiB of the embedded simulator, and for the predicted hits.")
@click.option("--output-dir", "--output-artifact-dir", "--artifact-dir", "output_dir",
              type=click.Path(path_type=Path), default=Path("artifacts/bench"), show_default=True)
def bench(url, cache_gb, output_dir, **kw):
    """Benchmark an OpenAI-compatible server with an AIPerf dataset (AIPerf-compatible metrics)."""
    from ..loadgen.run import run_bench

    cfg = _config(kw, url=url, cache_gb=cache_gb, output_dir=output_dir)
    result = run_bench(cfg)
    if not kw["quiet"]:
        click.echo(result.table)
        gp = result.export.get("goodput")
        if gp:
            click.echo(f"Goodput: {result.export['good_request_count']['avg']:,} good requests, "
                       f"{gp['avg'] or 0:,.2f} req/s (objectives "
                       + ", ".join(f"{k} <= {v:g}" for k, v in gp["slos"].items()) + ")")
        click.echo(f"\nexports: {result.paths['export']}  {result.paths['records']}")
    if not kw["no_report"]:
        from ..report.html import runs_report

        write_report(runs_report("bench", [("run", result.export)], "mmdatagen bench"),
                     output_dir, kw["quiet"], kw["png"])
    if result.export.get("was_cancelled"):
        raise SystemExit(130)


@click.command()
@_common_options
@click.option("--a-cache-gb", type=float, default=10.0, show_default=True, help="Run A's cache.")
@click.option("--b-cache-gb", type=float, default=0.0, show_default=True, help="Run B's cache.")
@click.option("--a-profile", default=None, help="Run A's simulator profile (default: --profile).")
@click.option("--b-profile", default=None, help="Run B's simulator profile (default: --profile).")
@click.option("--a-sim-arg", multiple=True, help="Extra serve argument for run A only.")
@click.option("--b-sim-arg", multiple=True, help="Extra serve argument for run B only.")
@click.option("--labels", nargs=2, default=("Cache ON", "Cache OFF"), show_default=True)
@click.option("--output-dir", type=click.Path(path_type=Path), default=Path("artifacts/ab"),
              show_default=True)
@click.option("--chart", is_flag=True, help="Also write comparison.png (needs matplotlib).")
def ab(a_cache_gb, b_cache_gb, a_profile, b_profile, a_sim_arg, b_sim_arg, labels, output_dir,
       chart, **kw):
    """Run the same benchmark twice on the embedded simulator (A vs B) and compare."""
    from ..loadgen.run import run_bench

    # ab reproduces seed A's benchmark unless told otherwise
    if kw["concurrency"] is None and kw["request_rate"] is None:
        kw["concurrency"] = 64
    if kw["warmup_request_count"] is None:
        kw["warmup_request_count"] = 3
    if kw["streaming"] is None:
        kw["streaming"] = True
    if not kw["extra_inputs"]:
        kw["extra_inputs"] = SEED_A_EXTRA
    exports = []
    base_args = list(kw["sim_args"])
    base_profile = kw["profile"]
    runs = []
    for tag, gb, prof, extra, label in (("a", a_cache_gb, a_profile, a_sim_arg, labels[0]),
                                        ("b", b_cache_gb, b_profile, b_sim_arg, labels[1])):
        kw["profile"] = prof or base_profile
        try:
            cfg = _config(kw, url=None, cache_gb=gb, output_dir=output_dir / tag)
        except UserError as exc:
            raise UserError(f"run {tag.upper()}: {exc}") from None
        cfg.sim_args = base_args + list(extra)
        _check_run(tag, cfg)  # both runs' settings before run A starts
        runs.append((tag, gb, label, cfg))
    for tag, gb, label, cfg in runs:
        if not kw["quiet"]:
            click.echo(f"== run {tag.upper()}: {label} (profile {cfg.profile}, cache {gb:g} GiB)",
                       err=True)
        result = run_bench(cfg)
        if result.export.get("was_cancelled"):
            raise UserError(f"run {tag.upper()} was interrupted; partial exports in {output_dir / tag}")
        if not kw["quiet"]:
            click.echo(_run_summary(tag, result.export), err=True)
        exports.append(result.export)
    _emit_comparison(exports[0], exports[1], tuple(labels), output_dir, chart,
                     report=not kw["no_report"], kind="ab", png=kw["png"])


def _check_run(tag: str, cfg) -> None:
    """One run's settings, including its simulator arguments (parsed as ``serve`` would)."""
    from ..loadgen.run import check_config
    from .serve import serve

    try:
        check_config(cfg)
        serve.make_context("serve", list(cfg.sim_args), resilient_parsing=False)
    except UserError as exc:
        raise UserError(f"run {tag.upper()}: {exc}") from None
    except click.ClickException as exc:
        raise UserError(f"run {tag.upper()}: simulator argument: {exc.format_message()}") from None


def _run_summary(tag: str, ex: dict) -> str:
    """One line per ab run: counts, errors, measured vs predicted image hit rate."""
    cache = ex.get("image_cache") or {}
    parts = [f"   run {tag.upper()}: {ex['request_count']['avg']:,} ok, "
             f"{ex['error_request_count']['avg']:,} errors"]
    for key, label in (("measured", "measured"), ("predicted", "predicted")):
        rate = (cache.get(key) or {}).get("hit_rate")
        if rate is not None:
            parts.append(f"{label} image hit rate {rate:.1%}")
    return ", ".join(parts)


def _emit_comparison(a: dict, b: dict, labels: tuple[str, str], out: Path, chart: bool,
                     report: bool = True, kind: str = "compare", png: bool = False) -> None:
    from ..io.atomic import atomic_write_bytes
    from ..loadgen import compare as cmp

    table = cmp.compare(a, b, labels)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {out}: {exc.strerror}") from None
    atomic_write_bytes(out / "comparison.md", cmp.markdown(table).encode())
    atomic_write_bytes(out / "comparison.json", orjson.dumps(table, option=orjson.OPT_INDENT_2))
    click.echo(cmp.plain(table))
    written = [out / "comparison.md", out / "comparison.json"]
    if chart:
        cmp.chart(table, out / "comparison.png")
        written.append(out / "comparison.png")
    click.echo("\nwritten: " + "  ".join(str(p) for p in written))
    if report:
        from ..report.html import runs_report

        write_report(runs_report(kind, [(labels[0], a), (labels[1], b)], f"mmdatagen {kind}: "
                                 f"{labels[0]} vs {labels[1]}", comparison=table), out, False, png)


@click.command()
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("--labels", nargs=2, default=("A", "B"), show_default=True)
@click.option("--output-dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="Where comparison.md / comparison.json (/ .png) go.")
@click.option("--chart", is_flag=True, help="Also write comparison.png (needs matplotlib).")
@goodput_option
@report_options
def compare(run_a, run_b, labels, output_dir, chart, goodput, no_report, png):
    """Compare two runs (folders or export JSONs, ours or AIPerf's): Metric | A | B | Delta %."""
    from ..loadgen import compare as cmp
    from ..loadgen.goodput import goodput_from_records_file, parse_slos
    from ..metrics import RECORDS_NAME

    slos = parse_slos(goodput)
    exports = []
    for run in (run_a, run_b):
        ex = cmp.load_export(run)
        if not no_report and "timeline" not in ex:  # an older export: aggregate its records
            from ..report.aggregate import aggregates_from_records_file

            ex.update(aggregates_from_records_file(cmp.find_export(run).parent / RECORDS_NAME)
                      or {})
        if slos:
            gp = goodput_from_records_file(cmp.find_export(run).parent / RECORDS_NAME, ex, slos)
            if gp is None:
                raise UserError(f"--goodput needs the per-request records.jsonl beside the "
                                f"export of {run}")
            ex.update(gp)
        exports.append(ex)
    _emit_comparison(exports[0], exports[1], tuple(labels), output_dir, chart,
                     report=not no_report, png=png)
