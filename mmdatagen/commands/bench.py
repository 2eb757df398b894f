"""``mmdatagen bench`` (the loader), ``mmdatagen ab`` (two runs on the simulator) and ``compare``."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import SpecError, UserError
from ..settings.cache import AbCache, BenchCache, Geometry
from ..settings.cli import make, options
from ..settings.load import AB_DEFAULTS, AbRuns, BenchTarget, Load, LoadShard
from .sweep import goodput_option, report_options, write_report

if TYPE_CHECKING:
    from ..report.html import ReportKind
    from ..settings.run import BenchRun


@click.command()
@options(Load, BenchTarget, BenchCache, Geometry, LoadShard)
@goodput_option
@report_options
def bench(**v: Any) -> None:
    """Benchmark an OpenAI-compatible server with an AIPerf dataset (AIPerf-compatible metrics)."""
    from ..io.atomic import writing
    from ..loadgen.run import finish_run, run_bench, run_outputs
    from ..loadgen.setup import bench_run

    load, target = make(Load, v), make(BenchTarget, v)
    run = bench_run(load, target, make(BenchCache, v), make(Geometry, v), make(LoadShard, v),
                    v["goodput"])
    out = Path(target.output_dir)
    with writing(out, run_outputs(out), [load.input_file]):  # the report is written too
        result = run_bench(run)
        _show(result, load.quiet)
        if not v["no_report"]:
            from ..report.html import runs_report

            write_report(runs_report("bench", [("run", result.export)], "mmdatagen bench"),
                         target.output_dir, load.quiet, v["png"])
    finish_run(result, "bench")  # stopped: 143 / 130; every request failed: 1


def _show(result: Any, quiet: bool) -> None:
    from ..loadgen.setup import goodput_line

    if not quiet:
        click.echo(result.table)
        if result.export.get("goodput"):
            click.echo(goodput_line(result.export))
        click.echo(f"\nexports: {result.paths['export']}  {result.paths['records']}")


@click.command()
@options(Load, AbRuns, AbCache, defaults=AB_DEFAULTS)
@goodput_option
@report_options
def ab(**v: Any) -> None:
    """Run the same benchmark twice on the embedded simulator (A vs B) and compare."""
    from ..io.atomic import writing
    from ..loadgen.setup import run_ab, run_summary

    load, runs = make(Load, v), make(AbRuns, v)

    def started(tag: str, label: str, run: BenchRun) -> None:
        from ..sim.study import cache_text

        if not load.quiet:  # the cache in its target's unit, --sim-arg overrides included
            click.echo(f"== run {tag.upper()}: {label} (profile {run.load.profile}, cache "
                       f"{cache_text(run.simulator())})", err=True)

    def done(tag: str, result: Any) -> None:
        if not load.quiet:
            click.echo(run_summary(tag, result.export), err=True)

    out = Path(runs.output_dir)
    with writing(out, _comparison_outputs(out, runs.chart, True), [load.input_file]):
        a, b = run_ab(load, runs, make(AbCache, v), started, done, v["goodput"])
        _emit_comparison(a, b, runs.labels, out, runs.chart, report=not v["no_report"],
                         kind="ab", png=v["png"])


def _comparison_outputs(out: Path, chart: bool, report: bool) -> list[Path]:
    """The files ab and compare write beside their runs."""
    from ..report.html import PLOTS_DIR, REPORT_NAME

    names = ["comparison.md", "comparison.json"] + (["comparison.png"] if chart else [])
    return [out / n for n in names] + ([out / REPORT_NAME, out / PLOTS_DIR] if report else [])


def _emit_comparison(a: dict, b: dict, labels: tuple[str, str], out: Path, chart: bool,
                     report: bool = True, kind: ReportKind = "compare", png: bool = False
                     ) -> None:
    from ..loadgen.compare import write_comparison

    text, written = write_comparison(a, b, labels, out, chart)
    click.echo(text)
    click.echo("\nwritten: " + "  ".join(str(p) for p in written))
    if report:
        from ..loadgen.compare import compare as table_of
        from ..report.html import runs_report

        write_report(runs_report(kind, [(labels[0], a), (labels[1], b)], f"mmdatagen {kind}: "
                                 f"{labels[0]} vs {labels[1]}", comparison=table_of(a, b, labels)),
                     out, False, png)


@click.command()
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("--labels", nargs=2, default=("A", "B"), show_default=True)
@click.option("--output-dir", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="Where comparison.md / comparison.json (/ .png) go.")
@click.option("--chart", is_flag=True, help="Also write comparison.png (needs matplotlib).")
@click.option("--force", is_flag=True, help="Overwrite comparison and report files that exist.")
@goodput_option
@report_options
def compare(run_a: Path, run_b: Path, labels: tuple[str, str], output_dir: Path, chart: bool,
            force: bool, goodput: tuple[str, ...], no_report: bool, png: bool) -> None:
    """Compare two runs (folders or export JSONs, ours or AIPerf's): Metric | A | B | Delta %."""
    from ..io.atomic import writing
    from ..loadgen import compare as cmp
    from ..metrics import RECORDS_NAME
    from ..settings.values import check_labels

    check_labels(labels)
    inputs = [p for run in (run_a, run_b)
              for p in (cmp.find_export(run), cmp.find_export(run).parent / RECORDS_NAME)]
    outputs = _comparison_outputs(output_dir, chart, not no_report)
    with writing(output_dir, outputs, inputs):
        existing = [p for p in outputs if p.is_file()]
        if existing and not force:
            raise SpecError("force", f"is needed: {existing[0]} exists")
        exports = [_run_export(run, no_report, goodput) for run in (run_a, run_b)]
        _emit_comparison(exports[0], exports[1], labels, output_dir, chart,
                         report=not no_report, png=png)


def _run_export(run: Path, no_report: bool, goodput: tuple[str, ...]) -> dict:
    """A run's export for compare: aggregates of older exports, goodput when asked."""
    from ..loadgen import compare as cmp
    from ..loadgen.goodput import goodput_from_records_file, parse_slos
    from ..metrics import RECORDS_NAME

    slos = parse_slos(goodput)
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
    return ex
