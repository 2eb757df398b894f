"""``mmdatagen pool`` and ``mmdatagen sliding-window``: build the specs, call the library, print."""
from __future__ import annotations

from typing import Any

import click

from ..settings.cli import PRESET_READ, config_option, make, options
from ..settings.content import SLIDING_WINDOW_CONTENT, Content, Media, Output
from ..settings.workload import PoolWorkload, SlidingWindowWorkload


def _run(workload: PoolWorkload | SlidingWindowWorkload, values: dict[str, Any]) -> None:
    from ..dataset import make_dataset, summary
    from ..io.atomic import reading

    content, media, output = make(Content, values), make(Media, values), make(Output, values)
    with reading([click.get_current_context().meta.get(PRESET_READ)]):  # --config's file
        result = make_dataset(workload, content, output, media)
    if not output.quiet:
        click.echo(summary(result), err=True)
    click.echo(str(result.path))


@click.command()
@config_option(PoolWorkload, Content, Media, Output)
@options(PoolWorkload, Content, Media, Output)
def pool(**values: Any) -> None:
    """Single-turn requests drawing images from a pool with controlled reuse.

    With no options: the reference dataset (1,000 requests, 1 image each, pool of 200,
    400 text tokens, seed 0), photo-like 640x480 JPEG files.
    """
    _run(make(PoolWorkload, values), values)


@click.command("sliding-window")
@config_option(SlidingWindowWorkload, Content, Media, Output)
@options(SlidingWindowWorkload, Content, Media, Output, defaults=SLIDING_WINDOW_CONTENT)
def sliding_window(**values: Any) -> None:
    """Per-user sessions whose consecutive turns share images (a sliding window).

    With no options: the reference dataset (30 users x 8 turns, window 5, 2400x1080 images
    as inline base64 data URLs, 8,000 text tokens, turn-major), photo-like JPEG content.
    """
    _run(make(SlidingWindowWorkload, values), values)
