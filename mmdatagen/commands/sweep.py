"""``mmdatagen sweep`` (a grid of benchmarks with repeats) and the shared ``--goodput`` option."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..settings.cli import Decorator, make, options
from ..settings.load import Load, Repeats
from ..settings.report import ReportOutput
from ..settings.sweep import LOAD_HELP, LOAD_SKIP, SweepGrid, SweepSearch, SweepTarget

if TYPE_CHECKING:
    from ..report.html import Report

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


def goodput_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--goodput", cls=GoodputOption, multiple=True, metavar="NAME:MS ...",
        help="Service-level objectives, e.g. --goodput ttft:300 itl:20 e2el:5000 (ms; also "
             "AIPerf's tags). A request is good when it meets every one; goodput = good requests "
             "/ benchmark duration (vLLM's and AIPerf's definition). Adds goodput and "
             "good_request_count to the export.")(f)


#: ``--no-report`` and ``--png`` (settings.report.ReportOutput), shared by bench, ab, compare, sweep.
report_options: Decorator = options(ReportOutput)


def write_report(rep: Report, out_dir: Path, quiet: bool, png: bool = False) -> None:
    """Write a report (and its PNGs when asked) and say where."""
    res = rep.write(out_dir, png=png)
    if not quiet:
        click.echo(f"report: {res['html']}" + (f"  (+ {len(res['pngs'])} PNG plots in "
                                                 f"{Path(res['html']).parent / 'plots'})"
                                                 if res["pngs"] else ""))


@click.command()
@options(Load, skip=LOAD_SKIP, help=LOAD_HELP)
@options(SweepGrid, Repeats, SweepTarget, SweepSearch)
@goodput_option
@report_options
def sweep(**v: Any) -> None:
    """Run one dataset over a grid (concurrency x request rate x cache size x profile fields),
    each point --repeats times; print and write mean ± 95 % CI per point (resumable).

    With --search rate: bisect instead to the highest request rate whose runs meet the
    --goodput SLOs (each probe printed; the result in sweep.json and search.csv)."""
    from ..loadgen.sweep import run_sweep, sweep_config, sweep_table

    load = make(Load, {k: x for k, x in v.items() if k not in LOAD_SKIP})  # grid: lists
    cfg = sweep_config(load, make(SweepGrid, v), make(SweepTarget, v), make(Repeats, v).repeats,
                       goodput=v["goodput"], report=make(ReportOutput, v),
                       search=make(SweepSearch, v))
    result = run_sweep(cfg)
    if load.quiet:
        result.check()
        return
    click.echo(sweep_table(result.doc))
    if "search" in result.doc:
        from ..loadgen.search import search_summary

        click.echo("\n" + search_summary(result.doc))
    searched = f"  {result.json.parent / 'search.csv'}" if "search" in result.doc else ""
    click.echo(f"\nwritten: {result.json}  {result.csv}{searched}")
    if result.report:
        pngs = result.report["pngs"]
        click.echo(f"report: {result.report['html']}"
                   + (f"  (+ {len(pngs)} PNG plots)" if pngs else ""))
    result.check()  # a run whose every request failed: exit 1
