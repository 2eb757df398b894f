"""``mmdatagen calibrate``: fit a simulator profile to measured runs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..settings.calibrate import CalibrateOutput
from ..settings.cli import make, options


@click.command()
@click.argument("runs", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@options(CalibrateOutput)
def calibrate(runs: tuple[Path, ...], **values: Any) -> None:
    """Fit the simulator's step-model costs (frontend, prefill, decode step, encoder, what a
    cache hit saves) to the per-request records of RUNS (folders bench, ab, sweep or simulate
    wrote), print each with its standard error and each run replayed with the fit, and write
    the fitted profile. Refuses runs that cannot identify a cost, naming the run to add.
    --holdout runs are not fitted: they are replayed with the fit, to check it. With
    --engine-log (vLLM's step lines) the step costs come from the engine's own step times."""
    from ..io.atomic import check_not_input, check_target, reading
    from ..settings.base import expand
    from ..sim.calibrate import calibrate as run_calibrate
    from ..sim.calibrate import report_lines, write_profile

    out = make(CalibrateOutput, values)
    output = Path(out.output)
    holdout = [Path(p) for p in expand(CalibrateOutput, "holdout", out.holdout)]
    logs = [Path(p) for p in expand(CalibrateOutput, "engine_log", out.engine_log)]
    check_target(output, out.force)
    check_not_input([output], [*runs, *holdout, *logs])
    with reading([*runs, *holdout, *logs]):
        cal = run_calibrate(list(runs), output, out.base_profile,
                            expand(CalibrateOutput, "hold", out.hold), holdout, logs)
        write_profile(output, cal.profile)
    if not out.quiet:
        click.echo("\n".join(report_lines(cal)))
    click.echo(str(output))
