"""``mmdatagen merge``: join dataset shards into the file one process would write."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..spec.cli import make, options
from ..spec.merge import MergeOutput


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
