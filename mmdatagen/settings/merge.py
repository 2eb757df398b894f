"""The spec of ``merge``: where the joined dataset goes and how the command reports."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import common
from .base import option, spec


@spec
@dataclass(frozen=True)
class MergeOutput:
    """The merged file (the shards themselves are the command's arguments)."""

    output: str | None = option(None, "--output", "Merged JSONL (default: the shard name "
                                "without .shard-K-of-N). Given alone, its shards are found "
                                "beside it.", short="-o", dir_okay=False)
    quiet: bool = common.quiet("No summary on stderr.")
    force: bool = common.force()


@spec
@dataclass(frozen=True)
class MergeRunsOutput:
    """``merge-runs``: where the joined benchmark goes (the workers' folders are the command's
    arguments)."""

    output_dir: Path = option(Path("artifacts/merged"), "--output-dir", "Folder of the merged "
                              "export, records.jsonl and report.", kind=Path)
    workers: int = common.workers(
        "Processes reading the workers' records and writing the merged ones")
    quiet: bool = common.quiet("No table.")
    force: bool = common.force()
