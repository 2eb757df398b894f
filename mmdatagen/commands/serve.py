"""``mmdatagen serve`` (real-time simulator over HTTP) and ``mmdatagen simulate`` (virtual time)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..spec.cache import Geometry, SimCache, SweepCache
from ..spec.cli import make, options
from ..spec.sim import Engine, Faults, Server, Simulator, VirtualRun


@click.command()
@options(Server, Engine, SimCache, Geometry, Faults)
def serve(**v: Any) -> None:
    """Serve an OpenAI-compatible VLM serving SIMULATOR (a performance model, not a language model)."""
    from ..sim.run import serve_spec

    serve_spec(Simulator(make(Server, v), make(Engine, v), make(SimCache, v), make(Geometry, v),
                         make(Faults, v)))


@click.command()
@click.argument("dataset", type=click.Path(path_type=Path))
@options(Engine, SimCache, Geometry, VirtualRun, SweepCache)
def simulate(dataset: Path, **v: Any) -> None:
    """Predict a benchmark's metrics in virtual time (no HTTP, no sleeping): same metrics and
    export shape as ``mmdatagen bench``, from the simulator's performance model."""
    from ..console import console_table
    from ..sim.study import cache_line, simulate_dataset
    from ..sim.virtual import sweep_table

    run = make(VirtualRun, v)
    study = simulate_dataset(dataset, make(Engine, v), make(SimCache, v), make(SweepCache, v), run,
                             make(Geometry, v))
    if run.quiet:
        return
    if study.sweep is not None:
        click.echo(sweep_table(study.sweep))
        click.echo("(simulated: mmdatagen's performance model, not a measurement)")
    elif study.export is not None and study.cache is not None:
        click.echo(console_table(study.export))
        click.echo(cache_line(study.cache))
