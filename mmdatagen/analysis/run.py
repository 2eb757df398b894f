"""One ``analyze`` request (``settings.analyze.AnalyzeRequest``) run end to end: the model, the
cache semantics and capacities, the traces (a dataset, or every plan of a workload sweep,
possibly a generator preset's) and one :class:`predict.Analysis` per trace."""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..console import NoBar, progress_bar
from ..errors import SpecError, UserError
from ..plans.base import Plan
from ..settings.analyze import POOL_ONLY, SW_ONLY, AnalyzeRequest, PlanAxes, Workload, numbers
from ..settings.base import build, for_cli
from ..settings.workload import PoolWorkload, SlidingWindowWorkload
from ..vlm import VisionModel
from .predict import Analysis, Semantics, analyze
from .trace import Trace

Result = tuple[dict, Analysis]
MAX_SWEEP = 10_000
POOL_DEFAULTS = {"num_requests": 1000, "pool_size": 200, "images_per_request": 1,
                 "image_size": "640x480", "seed": 0, "reuse": "first-pass-unique"}
SW_DEFAULTS = {"users": 30, "turns": 8, "window": 5, "stride": 1, "image_size": "2400x1080",
               "seed": 0, "order": "turn-major"}
MEDIA_AXES = ("videos_per_request", "audios_per_request")
POOL_AXES = ("num_requests", "pool_size", "images_per_request", "zipf_exponent", "target_reuse",
             "seed", *MEDIA_AXES, "video_pool_size", "audio_pool_size")
SW_AXES = ("users", "turns", "window", "stride", "shared_fraction", "seed", *MEDIA_AXES)


@dataclasses.dataclass
class Run:
    """What every trace of the request is analysed with."""

    model: VisionModel
    semantics: Semantics
    cache_bytes: list[int]
    cache_images: list[int]
    unknown_size: tuple[int, int] | None
    want_curve: bool

    def __call__(self, trace: Trace) -> Analysis:
        return analyze(trace, self.model, self.semantics, self.cache_bytes, self.cache_images,
                       self.unknown_size, self.want_curve)


def run_request(req: AnalyzeRequest) -> list[Result]:
    """One (swept parameters, analysis) per trace: one for a dataset, one per plan otherwise."""
    req = _with_preset(req)
    if (req.dataset is None) == (req.source.workload is None):
        raise SpecError("workload", "or a DATASET: give one of the two")
    run = _run_of(req)
    if req.dataset is not None:
        trace = dataset_trace(req)
        return [({}, run(trace))]
    results: list[Result] = []
    for params, plan in plans(req.source.workload or "", req.axes, req.media.video_size):
        if results and run.want_curve:
            raise SpecError("curve_path", "and `plot_path` take a single workload, not a sweep")
        trace = _plan_trace(plan, req)
        results.append((params, run(trace)))
    return results


def _run_of(req: AnalyzeRequest) -> Run:
    c = req.cache
    sem = Semantics(oversize=c.oversize, insert=c.register, in_flight=req.model.in_flight,
                    dispatch=c.dispatch, real_width=c.real_width, target=req.model.cache,
                    encoder_budget=req.model.encoder_budget)
    sem.check()
    target = sem.cache()
    caps = [target.capacity(x) for x in numbers(c.cache_size, "cache_size")]
    return Run(_model(req), sem, caps, numbers(c.cache_images, "cache_images"),
               _size(req.source.url_image_size), req.output.want_curve)


def _model(req: AnalyzeRequest) -> VisionModel:
    from ..vlm import generic_model, resolve_model

    m = req.model
    if m.tokens_per_image is not None and m.bytes_per_token is not None:
        return generic_model(m.tokens_per_image, m.bytes_per_token)
    return resolve_model(req.cache.model, req.geometry.model_path, **req.geometry.values())


def _size(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    from ..plans.sizes import parse_sizes

    w, h, _ = parse_sizes(value)[0]
    return w, h


def dataset_trace(req: AnalyzeRequest) -> Trace:
    """The dataset's trace: from its manifest when there is one (and it is wanted), else by
    streaming the JSONL with the target's key mode (tqdm on stderr)."""
    from .trace import dataset_size, trace_from_dataset, trace_from_manifest

    path = req.dataset
    assert path is not None
    if not path.is_file():
        raise UserError(f"dataset {path} not found")
    if not req.source.no_manifest:
        from ..io.manifest import manifest_path, read_manifest

        try:
            manifest = read_manifest(path)
        except UserError as exc:
            raise SpecError("no_manifest", f"scans the JSONL instead: {exc}") from None
        if manifest is not None:
            trace = trace_from_manifest(manifest, str(path))
            trace.info["manifest_path"] = str(manifest_path(path))
            return trace
    from ..caches import get_target

    key = req.cache.key or get_target(req.model.cache).key
    bar = progress_bar(dataset_size(path), req.output.quiet, desc="scanning", unit="B",
                       unit_scale=True)
    try:
        return trace_from_dataset(path, key, req.source.dataset_type,
                                  None if isinstance(bar, NoBar) else bar.update)
    finally:
        bar.close()


def _plan_trace(plan: Plan, req: AnalyzeRequest) -> Trace:
    from .trace import trace_from_plan

    styles, _ = req.media.styles(plan.media)
    trace = trace_from_plan(plan, styles)
    if req.source.preset:
        trace.source = f"{trace.source} of preset {req.source.preset}"
    return trace


def plans(workload: str, axes: PlanAxes, video_size: str | None = None
          ) -> Iterator[tuple[dict, Plan]]:
    """Every plan of the sweep (cartesian product of multi-valued parameters), one at a time,
    each checked by the generators' own spec (ranges, conflicts, sizes)."""
    from ..plans import pool_plan, sliding_window_plan

    pool = workload == "pool"
    grid = _grid(axes, POOL_AXES if pool else SW_AXES, POOL_DEFAULTS if pool else SW_DEFAULTS)
    swept = [k for k, v in grid.items() if len(v) > 1]
    fixed = _fixed(workload, axes)
    make_plan: Callable[..., Plan] = pool_plan if pool else sliding_window_plan
    for combo in itertools.product(*grid.values()):
        args = dict(zip(grid, combo))
        if args.get("target_reuse") is not None and not axes.pool_size:
            args.pop("pool_size", None)
        _check_plan(PoolWorkload if pool else SlidingWindowWorkload, {**args, **fixed})
        sizing = {"video_size": video_size} if video_size else {}
        yield {k: args[k] for k in swept}, make_plan(**args, **fixed, **sizing)


def _fixed(workload: str, axes: PlanAxes) -> dict[str, Any]:
    """The workload's row rule (reuse or order); parameters of the other workload refused."""
    pool = workload == "pool"
    wrong = [k for k in (SW_ONLY if pool else POOL_ONLY) if getattr(axes, k)]
    if wrong:
        raise SpecError(wrong[0], f"does not apply to `workload` {workload}")
    if pool:
        return {"reuse": axes.reuse or POOL_DEFAULTS["reuse"]}
    return {"order": axes.order or SW_DEFAULTS["order"]}


def _grid(axes: PlanAxes, names: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, list]:
    grid: dict[str, list] = {}
    for name in names:
        vals = numbers(getattr(axes, name), name)
        if vals or name in defaults:
            grid[name] = vals or [defaults[name]]
    grid["image_size"] = list(axes.image_size) or [defaults["image_size"]]
    total = math.prod(len(v) for v in grid.values())
    if total > MAX_SWEEP:
        raise UserError(f"the sweep has {total:,} workloads; at most {MAX_SWEEP:,}")
    return grid


def _check_plan(cls: type, values: dict) -> None:
    try:
        build(cls, values)
    except SpecError as exc:
        raise for_cli(exc) from None


def _with_preset(req: AnalyzeRequest) -> AnalyzeRequest:
    """Plan parameters the user did not give filled from a generator preset (``--config``)."""
    if not req.source.preset:
        return req
    from ..presets import find_config, load_yaml

    preset = req.source.preset
    data = {str(k).replace("-", "_"): v for k, v in load_yaml(find_config(preset)).items()}
    kind: Workload = "sliding-window" if "users" in data or "window" in data else "pool"
    if req.source.workload is not None and req.source.workload != kind:
        raise UserError(f"preset {preset} is a {kind} workload, not {req.source.workload}")
    keys = set(POOL_ONLY if kind == "pool" else SW_ONLY) | {"image_size", "seed"}
    fill: dict[str, Any] = {}
    for key, value in data.items():
        if key in keys and not getattr(req.axes, key):
            fill[key] = (",".join(map(str, value)) if isinstance(value, list) else str(value),)
        elif key in ("reuse", "order") and getattr(req.axes, key) is None:
            fill[key] = str(value)
    axes = dataclasses.replace(req.axes, **fill)
    return dataclasses.replace(req, axes=axes,
                               source=dataclasses.replace(req.source, workload=kind))


def check_outputs(req: AnalyzeRequest) -> None:
    """--curve / --plot never overwrite an input, nor an existing file without --force."""
    out = req.output
    outputs: list[Path] = [p for p in (out.curve_path, out.plot_path) if p is not None]
    if not outputs:
        return
    from ..io.atomic import check_not_input, check_target
    from ..io.manifest import manifest_path

    if req.dataset is not None:
        check_not_input(outputs, [req.dataset, manifest_path(req.dataset)])
    for path in outputs:
        check_target(path, out.force)
