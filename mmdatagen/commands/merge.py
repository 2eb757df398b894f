"""``mmdatagen merge``: join dataset shards into the file one process would write."""
from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("shards", nargs=-1, type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Merged JSONL (default: the shard name without .shard-K-of-N). Given alone, "
                   "its shards are found beside it.")
@click.option("--quiet", "-q", is_flag=True, help="No summary on stderr.")
@click.option("--force", "-f", is_flag=True, help="Overwrite an existing merged output.")
def merge(shards: tuple[str, ...], output: str | None, quiet: bool, force: bool) -> None:
    """Join shards (JSONL and manifests) into exactly the bytes one unsharded run writes.

    Refuses shards that do not belong together: different parameters, seed or version, a
    missing or duplicate shard, or a different shard count.
    """
    from ..errors import UserError
    from ..merge import merge as run_merge

    if not shards and output is None:
        raise UserError("give shard files, or --output to find its shards beside it")
    result = run_merge([Path(s) for s in shards], Path(output) if output else None, force)
    if not quiet:
        click.echo(f"merged {result.shards} shards, {result.lines} lines", err=True)
    click.echo(str(result.path))
