"""``mmdatagen serve`` (real-time simulator over HTTP) and ``mmdatagen simulate`` (virtual time)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..settings.cache import Geometry, SimCache, SweepCache, simulate_caches
from ..settings.cli import make, options
from ..settings.sim import Engine, Faults, Server, Simulator, VirtualRun


@click.command()
@options(Server, Engine, SimCache, Geometry, Faults)
def serve(**v: Any) -> None:
    """Serve an OpenAI-compatible VLM serving SIMULATOR (a performance model, not a language model)."""
    from ..io.atomic import check_not_input
    from ..sim.run import serve_spec

    spec = Simulator(make(Server, v), make(Engine, v), make(SimCache, v), make(Geometry, v),
                     make(Faults, v))
    if spec.server.ready_file is not None:  # not over the profile or model it reads
        check_not_input([spec.server.ready_file], [spec.engine.profile, spec.geometry.model_path])
    serve_spec(spec)


@click.command()
@click.argument("dataset", type=click.Path(path_type=Path))
@options(Engine, SimCache, skip=("cache_size",))
@options(SweepCache, Geometry, VirtualRun)
def simulate(dataset: Path, **v: Any) -> None:
    """Predict a benchmark's metrics in virtual time (no HTTP, no sleeping): same metrics and
    export shape as ``mmdatagen bench``, from the simulator's performance model."""
    from ..console import console_table
    from ..sim.study import cache_line
    from ..sim.whatif import whatif_table

    run = make(VirtualRun, v)
    study = _simulate(dataset, run, v)
    if study.whatif is not None and run.output_dir is not None:
        from ..report.html import whatif_report

        whatif_report(study.whatif).write(Path(run.output_dir))
    if run.quiet:
        return
    if study.sweep is not None:
        click.echo(whatif_table(study.sweep, study.unit, study.slo))
        click.echo("(simulated: mmdatagen's performance model, not a measurement)")
    elif study.export is not None and study.cache is not None:
        click.echo(console_table(study.export))
        click.echo(cache_line(study.cache))


def _simulate(dataset: Path, run: VirtualRun, v: dict[str, Any]) -> Any:
    """The study, its outputs checked first: none is an input, one writer per folder."""
    from ..io.atomic import reading, writing
    from ..io.manifest import manifest_path
    from ..metrics import EXPORT_NAME, RECORDS_NAME
    from ..report.html import REPORT_NAME
    from ..sim.study import simulate_dataset

    inputs = [dataset, manifest_path(dataset)]
    out = None if run.output_dir is None else Path(run.output_dir)
    with (reading(inputs) if out is None else
          writing(out, [out / n for n in (EXPORT_NAME, RECORDS_NAME, "sweep.json", REPORT_NAME)],
                  inputs)):
        cache, sweep = simulate_caches(v)  # one --cache-size, or several to sweep
        return simulate_dataset(dataset, make(Engine, v), cache, sweep, run, make(Geometry, v))
