"""``mmdatagen analyze``: predicted embedding-cache hit rates for a dataset or a workload plan."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import SpecError
from ..settings.analyze import (
    MEDIA_SIZING,
    AnalyzeCache,
    AnalyzeOutput,
    AnalyzeRequest,
    AnalyzeSource,
    PlanAxes,
)
from ..settings.base import for_cli
from ..settings.cache import AnalyzeModel, Geometry
from ..settings.cli import options
from ..settings.content import Media


@click.command(context_settings={"max_content_width": 100})
@click.argument("dataset", required=False, type=click.Path(dir_okay=False, path_type=Path))
@options(AnalyzeCache, AnalyzeModel, Geometry, AnalyzeSource, PlanAxes, AnalyzeOutput)
@options(Media, only=MEDIA_SIZING)
def analyze(dataset: Path | None, **values: Any) -> None:
    """Predict embedding-cache hit rates for every cache size.

    Give a DATASET (any AIPerf single_turn/multi_turn JSONL; an mmdatagen manifest beside it is
    used when present, so no image is read) or --workload with plan parameters (sweeps: repeat a
    parameter or give a range). Prediction is exact for an LRU by bytes with whole-entry eviction.
    Videos and audio clips share the one cache with images and are also reported per modality.

    Concurrency model: at most --in-flight requests (or sessions) in flight, completing
    first-in first-out, the next dispatched at once. With --insert completion a lookup only sees
    entries of requests that already completed.
    """
    from ..analysis.report import render
    from ..analysis.run import check_outputs, run_request

    try:
        request = AnalyzeRequest.of(dataset, values)
        check_outputs(request)
        results = run_request(request)
    except SpecError as exc:  # a field's error, worded with its flag
        raise for_cli(exc) from None
    click.echo(render(results, request.output, lambda text: click.echo(text, err=True)))
