"""``mmdatagen sweep`` (a grid of benchmarks with repeats) and the shared ``--goodput`` option."""
from __future__ import annotations

import re
from pathlib import Path

import click

from ..errors import UserError
from ..spec.cli import make, options
from ..spec.load import Load, Repeats

_SLO_TOKEN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*:[0-9.eE+-]+$")


class GoodputOption(click.Option):
    """``--goodput ttft:300 itl:20 e2el:5000``: takes every following NAME:VALUE token (as vLLM's
    nargs='+' flag does); repeating the flag works too."""

    def add_to_parser(self, parser, ctx):
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            # click's parser keeps its options here (8.x); without them the flag still takes
            # one NAME:VALUE per use (repeat --goodput), which parse_slos also accepts
            opt = (getattr(parser, "_long_opt", {}).get(name)
                   or getattr(parser, "_short_opt", {}).get(name))
            if opt is None:
                continue
            prev = opt.process

            def process(value, state, prev=prev):
                vals = [value]
                while state.rargs and _SLO_TOKEN.match(state.rargs[0]):
                    vals.append(state.rargs.pop(0))
                prev(" ".join(vals), state)

            opt.process = process


def goodput_option(f):
    return click.option(
        "--goodput", cls=GoodputOption, multiple=True, metavar="NAME:MS ...",
        help="Service-level objectives, e.g. --goodput ttft:300 itl:20 e2el:5000 (ms; also "
             "AIPerf's tags). A request is good when it meets every one; goodput = good requests "
             "/ benchmark duration (vLLM's and AIPerf's definition). Adds goodput and "
             "good_request_count to the export.")(f)


def report_options(f):
    f = click.option("--png", is_flag=True,
                     help="Also write the report's plots as PNG files in plots/ (matplotlib).")(f)
    f = click.option("--no-report", is_flag=True, help="Do not write report.html.")(f)
    return f


def write_report(rep, out_dir: Path, quiet: bool, png: bool = False) -> None:
    """Write a report (and its PNGs when asked) and say where."""
    res = rep.write(out_dir, png=png)
    if not quiet:
        click.echo(f"report: {res['html']}" + (f"  (+ {len(res['pngs'])} PNG plots in "
                                                 f"{Path(res['html']).parent / 'plots'})"
                                                 if res["pngs"] else ""))


@click.command()
@click.option("--input-file", required=True, type=click.Path(path_type=Path),
              help="AIPerf custom dataset JSONL (.gz accepted): the one dataset of every point.")
@click.option("--custom-dataset-type", "dataset_type", default="auto", show_default=True,
              type=click.Choice(["auto", "single_turn", "multi_turn", "random_pool"]))
@click.option("-m", "--model", "--model-names", "model", default=None,
              help="Model name sent in the body (default with the simulator: its model).")
@click.option("--url", default=None,
              help="Your server. Omit to run the embedded simulator, a FRESH server per run "
                   "(every run starts with a cold cache). With --url the server is used as it "
                   "is: its cache is not reset between runs.")
@click.option("--virtual", is_flag=True,
              help="Run the simulator's model in virtual time (as 'mmdatagen simulate'; a fresh "
                   "engine, cold cache, per run): seconds instead of minutes.")
@click.option("--concurrency", default=None, help="Comma list, e.g. 1,8,32,64.")
@click.option("--request-rate", default=None, help="Comma list of requests/s (concurrency caps).")
@click.option("--cache-gb", default=None,
              help="Comma list of simulator embedding-cache GiB (default 10; simulator only).")
@click.option("--sim-param", "sim_params", multiple=True, metavar="FIELD=V1,V2",
              help="Sweep a simulator profile field, e.g. max_running=32,52; repeatable.")
@options(Repeats)
@options(Load, only=("request_count", "warmup_request_count"),
         help={"request_count": "Profiling requests per run (default: one pass over the "
                                "dataset)."})
@click.option("--extra-inputs", multiple=True, help="KEY:VALUE merged into every body.")
@click.option("--streaming/--no-streaming", default=True, show_default=True,
              help="Stream (needed for TTFT and ITL).")
@click.option("--arrival", type=click.Choice(["poisson", "constant"]), default="poisson",
              show_default=True)
@options(Load, only=("request_timeout",))
@click.option("-H", "--header", "headers", multiple=True, help="K:V request header; repeatable.")
@click.option("--api-key", envvar="MMDATAGEN_API_KEY", default=None, show_envvar=True)
@click.option("--endpoint-type", type=click.Choice(["chat", "completions"]), default="chat",
              show_default=True)
@click.option("--profile", default="qwen3-vl-30b-gb200", show_default=True,
              help="Simulator profile (no --url).")
@options(Load, only=("time_scale",))
@click.option("--sim-arg", "sim_args", multiple=True, help="Extra 'mmdatagen serve' argument.")
@click.option("--http-client", type=click.Choice(["raw", "aiohttp"]), default="raw",
              show_default=True)
@options(Load, only=("seed",), help={"seed": "Repeat k uses seed + k - 1 (arrivals, "
                                            "random_pool draws)."})
@click.option("--no-predict", is_flag=True, help="Skip the predicted cache hits.")
@options(Load, only=("metrics_interval",))
@goodput_option
@report_options
@click.option("--output-dir", type=click.Path(path_type=Path), default=Path("artifacts/sweep"),
              show_default=True, help="sweep.json, sweep.csv, report.html and <point>/r<k>/.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines and no table.")
def sweep(input_file, dataset_type, model, url, virtual, concurrency, request_rate, cache_gb,
          sim_params, repeats, request_count, warmup_request_count, extra_inputs, streaming,
          arrival, request_timeout, headers, api_key, endpoint_type, profile, time_scale,
          sim_args, http_client, seed, no_predict, metrics_interval, goodput, no_report, png,
          output_dir, quiet):
    """Run one dataset over a grid (concurrency x request rate x cache size x profile fields),
    each point --repeats times; print and write mean ± 95 % CI per point (resumable)."""
    from ..loadgen.goodput import parse_slos
    from ..loadgen.payload import parse_extra_inputs, parse_headers
    from ..loadgen.run import BenchConfig
    from ..loadgen.sweep import SweepConfig, parse_grid, run_sweep, sweep_table

    make(Repeats, {"repeats": repeats})
    make(Load, {"request_count": request_count, "warmup_request_count": warmup_request_count,
                "request_timeout": request_timeout, "time_scale": time_scale, "seed": seed,
                "metrics_interval": metrics_interval})
    if model is None:
        if url:
            raise UserError("--model is required with --url")
        from ..sim.profile import load_profile

        model = load_profile(profile).served_model_name
    if metrics_interval <= 0:
        raise UserError("--metrics-interval must be positive")
    grid = parse_grid(concurrency, request_rate, cache_gb, sim_params)
    base = BenchConfig(
        input_file=input_file, model=model, url=url, dataset_type=dataset_type,
        request_count=request_count, warmup_request_count=warmup_request_count,
        extra_inputs=parse_extra_inputs(extra_inputs), streaming=streaming,
        arrival=arrival, request_timeout=request_timeout, headers=parse_headers(headers),
        api_key=api_key, endpoint_type=endpoint_type, profile=profile, cache_gb=10.0,
        sim_args=list(sim_args), time_scale=time_scale, http_client=http_client, seed=seed,
        quiet=True, predict=not no_predict, goodput=parse_slos(goodput),
        metrics_interval=metrics_interval)
    cfg = SweepConfig(base=base, grid=grid, repeats=repeats, output_dir=output_dir,
                      virtual=virtual, report=not no_report, png=png, quiet=quiet)
    doc = run_sweep(cfg)
    paths = doc.pop("_paths")
    if not quiet:
        click.echo(sweep_table(doc))
        click.echo(f"\nwritten: {paths['json']}  {paths['csv']}")
        rep = paths.get("report")
        if rep:
            click.echo(f"report: {rep['html']}" + (f"  (+ {len(rep['pngs'])} PNG plots)"
                                                     if rep["pngs"] else ""))
