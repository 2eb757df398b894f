"""``mmdatagen merge``: join dataset shards into the file one process would write."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..settings.cli import make, options
from ..settings.merge import MergeOutput, MergeRunsOutput
from .sweep import report_options, write_report


@click.command()
@click.argument("shards", nargs=-1, type=click.Path(dir_okay=False))
@options(MergeOutput)
def merge(shards: tuple[str, ...], **values: Any) -> None:
    """Join shards (JSONL and manifests) into exactly the bytes one unsharded run writes.

    Refuses shards that do not belong together: different parameters, seed or version, a
    missing or duplicate shard, or a different shard count.
    """
    from ..errors import UserError
    from ..merge import merge as run_merge

    out = make(MergeOutput, values)
    if not shards and out.output is None:
        raise UserError("give shard files, or --output to find its shards beside it")
    result = run_merge([Path(s) for s in shards], Path(out.output) if out.output else None,
                       out.force)
    if not out.quiet:
        click.echo(f"merged {result.shards} shards, {result.lines} lines", err=True)
    click.echo(str(result.path))


@click.command("merge-runs")
@click.argument("runs", nargs=-1, type=click.Path(file_okay=False))
@options(MergeRunsOutput)
@report_options
def merge_runs(runs: tuple[str, ...], **values: Any) -> None:
    """Join the folders of sharded load workers (bench --num-shards N --shard-index K) into one
    export: records on the server's clock, percentiles over the union, the cache prediction
    replayed over every worker's requests. Refuses workers of different benchmarks and a
    missing or repeated shard."""
    from ..console import console_table
    from ..io.atomic import output_lock
    from ..loadgen.merge_runs import merge_runs as run_merge_runs

    out = make(MergeRunsOutput, values)
    with output_lock(Path(out.output_dir)):  # the report is written into it too
        result = run_merge_runs([Path(r) for r in runs], Path(out.output_dir), out.force,
                                out.workers)
        if not out.quiet:
            click.echo(console_table(result.export))
            click.echo(f"\nmerged {result.workers} workers, {len(result.records)} records: "
                       f"{result.paths['export']}  {result.paths['records']}")
        if not values["no_report"]:
            from ..report.html import runs_report

            write_report(runs_report("bench", [("merged", result.export)],
                                     "mmdatagen merge-runs"),
                         Path(out.output_dir), out.quiet, values["png"])
