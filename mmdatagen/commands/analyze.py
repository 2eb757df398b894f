"""``mmdatagen analyze``: predicted embedding-cache hit rates for a dataset or a workload plan."""
from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from ..errors import UserError
from ..spec.cache import AnalyzeModel, Geometry
from ..spec.cli import make, options
from ..spec.workload import PoolWorkload, SlidingWindowWorkload

GIB = 1 << 30
POOL_DEFAULTS = {"num_requests": 1000, "pool_size": 200, "images_per_request": 1,
                 "image_size": "640x480", "seed": 0}
SW_DEFAULTS = {"users": 30, "turns": 8, "window": 5, "stride": 1, "image_size": "2400x1080",
               "seed": 0}
POOL_ONLY = ("num_requests", "pool_size", "images_per_request", "zipf_exponent", "target_reuse")
SW_ONLY = ("users", "turns", "window", "stride", "shared_fraction")


def _numbers(values: tuple[str, ...], kind: type, name: str) -> list:
    """Expand ``1 2.5 0:20:2 5,6`` (repeatable; ranges include their end) into numbers."""
    out: list = []
    for raw in values:
        for item in str(raw).split(","):
            item = item.strip()
            if not item:
                continue
            try:
                if ":" in item:
                    parts = [kind(p) for p in item.split(":")]
                    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] <= 0):
                        raise ValueError
                    lo, hi = parts[0], parts[1]
                    step = parts[2] if len(parts) == 3 else 1
                    count = int((hi - lo) / step + 1e-9) + 1
                    if count < 1:
                        raise UserError(f"{name} range {item!r} is empty (start above stop)")
                    if count > 100_000:
                        raise UserError(f"{name} range {item!r} has more than 100,000 values")
                    out += [kind(round(lo + i * step, 9)) for i in range(max(count, 0))]
                else:
                    out.append(kind(item))
                if not all(math.isfinite(v) for v in out[-1:]):
                    raise ValueError
            except (ValueError, OverflowError):
                raise UserError(f"bad {name} value {item!r}; expected a number, a list 1,2,4 or a "
                                "range start:stop[:step]") from None
    if any(v < 0 for v in out):
        raise UserError(f"{name} must not be negative")
    return out


def _size(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    from ..plans.sizes import parse_sizes

    w, h, _ = parse_sizes(value)[0]
    return w, h


def _model(name: str, tokens_per_image: int | None, bytes_per_token: int | None,
           geometry: Geometry):
    from ..vlm import generic_model, resolve_model

    if tokens_per_image is not None or bytes_per_token is not None:
        if tokens_per_image is None or bytes_per_token is None:
            raise UserError("--tokens-per-image and --bytes-per-token go together")
        return generic_model(tokens_per_image, bytes_per_token)
    return resolve_model(name, geometry.model_path, **geometry.values())


def _progress(total: int | None, quiet: bool):
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="scanning", unit="B", unit_scale=True, file=sys.stderr,
                leave=False)


def _dataset_trace(path: Path, key: str, fmt: str, use_manifest: bool, quiet: bool):
    from ..analysis.trace import dataset_size, trace_from_dataset, trace_from_manifest

    if not path.is_file():
        raise UserError(f"dataset {path} not found")
    if use_manifest:
        from ..io.manifest import manifest_path, read_manifest

        try:
            manifest = read_manifest(path)
        except UserError as exc:
            raise UserError(f"{exc}; pass --no-manifest to scan the JSONL instead") from None
        if manifest is not None:
            return trace_from_manifest(manifest, str(path)), str(manifest_path(path))
    bar = _progress(dataset_size(path), quiet)
    try:
        return trace_from_dataset(path, key, fmt, bar.update if bar else None), None
    finally:
        if bar is not None:
            bar.close()


def _plans(workload: str, opts: dict) -> Iterator[tuple[dict, object]]:
    """Every plan of the sweep (cartesian product of multi-valued parameters), one at a time."""
    from ..plans import pool_plan, sliding_window_plan

    if workload == "pool":
        fn, defaults, other = pool_plan, POOL_DEFAULTS, SW_ONLY
        names = {"num_requests": int, "pool_size": int, "images_per_request": int,
                 "zipf_exponent": float, "target_reuse": float, "seed": int}
        fixed = {"reuse": opts["reuse"]}
    else:
        fn, defaults, other = sliding_window_plan, SW_DEFAULTS, POOL_ONLY
        names = {"users": int, "turns": int, "window": int, "stride": int, "shared_fraction": float,
                 "seed": int}
        fixed = {"order": opts["order"]}
    wrong = [k for k in other if opts[k]]
    if wrong:
        raise UserError(f"--{wrong[0].replace('_', '-')} does not apply to --workload {workload}")
    axes: dict[str, list] = {}
    for name, kind in names.items():
        vals = _numbers(opts[name], kind, "--" + name.replace("_", "-")) if opts[name] else []
        if vals:
            axes[name] = vals
        elif name in defaults:
            axes[name] = [defaults[name]]
    image_sizes = list(opts["image_size"]) or [defaults["image_size"]]
    axes["image_size"] = image_sizes
    swept = [k for k, v in axes.items() if len(v) > 1]
    total = math.prod(len(v) for v in axes.values())
    if total > 10_000:
        raise UserError(f"the sweep has {total:,} workloads; at most 10,000")
    spec_cls = PoolWorkload if workload == "pool" else SlidingWindowWorkload
    for combo in itertools.product(*axes.values()):
        args = dict(zip(axes, combo))
        if args.get("target_reuse") is not None and not opts["pool_size"]:
            args.pop("pool_size", None)
        make(spec_cls, {**args, **fixed})  # the generators' checks: ranges, conflicts, sizes
        yield {k: args[k] for k in swept}, fn(**args, **fixed)


def _apply_preset(ctx: click.Context, preset: str, workload: str | None, opts: dict) -> str:
    """Fill plan options the user did not give from a generator preset; returns the workload."""
    from ..presets import find_config, load_yaml

    data = {str(k).replace("-", "_"): v for k, v in load_yaml(find_config(preset)).items()}
    kind = "sliding-window" if "users" in data or "window" in data else "pool"
    if workload is not None and workload != kind:
        raise UserError(f"preset {preset} is a {kind} workload, not {workload}")
    plan_keys = set(POOL_ONLY if kind == "pool" else SW_ONLY) | {"image_size", "seed"}
    for key, value in data.items():
        if key in plan_keys and not opts[key]:
            if isinstance(value, list):
                value = ",".join(map(str, value))
            opts[key] = (str(value),)
        elif key in ("reuse", "order") and \
                ctx.get_parameter_source(key) == click.core.ParameterSource.DEFAULT:
            opts[key] = str(value)
    return kind


@click.command(context_settings={"max_content_width": 100})
@click.argument("dataset", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", default="qwen3-vl-30b-a3b", show_default=True,
              help="Registry name, alias or Hugging Face id (see mmdatagen/data/models.json).")
@options(AnalyzeModel, Geometry)
@click.option("--real-width", is_flag=True,
              help="Count the real stored width (DeepStack x4 for Qwen3-VL), not Dynamo's accounting.")
@click.option("--cache-gb", multiple=True, metavar="GIB",
              help="Capacity in GiB (2^30 B, as Dynamo's --multimodal-embedding-cache-capacity-gb); repeat, list (1,4,10) or range start:stop[:step] (inclusive).")
@click.option("--cache-size", multiple=True, metavar="SIZE",
              help="Capacity in the --cache target's own unit (GiB, MiB for sglang-vlm, tokens "
              "for vllm-encoder); same forms as --cache-gb.")
@click.option("--cache-images", multiple=True, metavar="N",
              help="Capacity in entries (an LRU counting images); same forms as --cache-gb.")
@click.option("--key", type=click.Choice(["bytes", "pixels", "reference", "uuid"]), default=None,
              help="Image identity: encoded bytes, pixels (Dynamo aggregated), reference string "
              "(Dynamo disaggregated), image_uuids else bytes (vLLM). Default: the target's.")
@click.option("--insert", type=click.Choice(["schedule", "completion"]), default=None,
              help="Entries present from scheduling (in-flight duplicates hit) or only after the "
              "request completes (in-flight duplicates miss). Default: the target's.")
@click.option("--dispatch", type=click.Choice(["file", "sessions"]), default="file",
              show_default=True, help="File order, or AIPerf's causal session replay (a session's "
              "next row only after its previous completes).")
@click.option("--oversize", type=click.Choice(["bypass", "flush"]), default=None,
              help="An entry larger than the cache: skipped (Dynamo, vLLM) or evicts everything "
              "and is not stored (SGLang). Default: the target's.")
@click.option("--url-image-size", metavar="WxH",
              help="Dimensions to assume for http(s) URLs and uuid-only references.")
@click.option("--format", "fmt", type=click.Choice(["auto", "single_turn", "multi_turn"]),
              default="auto", show_default=True)
@click.option("--no-manifest", is_flag=True, help="Scan the JSONL even when a manifest is present.")
@click.option("--workload", type=click.Choice(["pool", "sliding-window"]),
              help="Analyse a workload plan instead of a dataset (no pixels made).")
@click.option("--config", "preset", metavar="PRESET",
              help="A generator preset (name in configs/ or YAML path): analyse its workload; "
              "flags override it, content keys (text, pixels, delivery) are ignored.")
@click.option("--num-requests", multiple=True, metavar="LIST", help="pool: requests [1000].")
@click.option("--pool-size", multiple=True, metavar="LIST", help="pool: pool size [200].")
@click.option("--images-per-request", multiple=True, metavar="LIST", help="pool: images per request [1].")
@click.option("--reuse", type=click.Choice(["first-pass-unique", "uniform", "zipf", "cyclic"]),
              default="first-pass-unique", show_default=True, help="pool: reuse pattern.")
@click.option("--zipf-exponent", multiple=True, metavar="LIST", help="pool: Zipf exponent [1.0].")
@click.option("--target-reuse", multiple=True, metavar="LIST", help="pool: best hit rate; derives the pool size.")
@click.option("--users", multiple=True, metavar="LIST", help="sliding-window: users [30].")
@click.option("--turns", multiple=True, metavar="LIST", help="sliding-window: turns per user [8].")
@click.option("--window", multiple=True, metavar="LIST", help="sliding-window: images per turn [5].")
@click.option("--stride", multiple=True, metavar="LIST", help="sliding-window: window shift per turn [1].")
@click.option("--shared-fraction", multiple=True, metavar="LIST", help="sliding-window: share of window slots "
              "common to all users [0].")
@click.option("--order", type=click.Choice(["turn-major", "user-major", "random"]),
              default="turn-major", show_default=True, help="sliding-window: row order.")
@click.option("--image-size", multiple=True, help="Workload image size WxH or weighted list "
              "[pool 640x480, sliding-window 2400x1080]; repeat to sweep.")
@click.option("--seed", multiple=True, metavar="LIST", help="Plan seed [0]; several to see spread.")
@click.option("--curve", "curve_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the full curve (every capacity where the hit count changes): .csv or .json.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw hit rate against cache size (PNG; needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the report.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option("--force", "-f", is_flag=True, help="Overwrite an existing --curve / --plot file.")
def analyze(dataset: Path | None, model: str, tokens_per_image: int | None,
            bytes_per_token: int | None, real_width: bool, cache_gb: tuple, cache_size: tuple,
            cache_images: tuple, key: str | None, insert: str | None, in_flight: int, dispatch: str, oversize: str,
            url_image_size: str | None, fmt: str, no_manifest: bool, workload: str | None,
            preset: str | None, curve_path: Path | None, plot_path: Path | None, as_json: bool, quiet: bool,
            force: bool, **plan_opts) -> None:
    """Predict image-embedding-cache hit rates for every cache size.

    Give a DATASET (any AIPerf single_turn/multi_turn JSONL; an mmdatagen manifest beside it is
    used when present, so no image is read) or --workload with plan parameters (sweeps: repeat a
    parameter or give a range). Prediction is exact for an LRU by bytes with whole-entry eviction.

    Concurrency model: at most --in-flight requests (or sessions) in flight, completing
    first-in first-out, the next dispatched at once. With --insert completion a lookup only sees
    entries of requests that already completed.
    """
    from ..analysis.predict import Semantics
    from ..analysis.predict import analyze as run
    from ..analysis.report import format_report, format_sweep, plot_curve, to_json, write_curve
    target = make(AnalyzeModel, {"tokens_per_image": tokens_per_image,
                                 "bytes_per_token": bytes_per_token, "in_flight": in_flight,
                                 "cache": plan_opts.pop("cache")}).cache
    geometry = make(Geometry, {k: plan_opts.pop(k) for k in Geometry.__dataclass_fields__})
    if preset:
        workload = _apply_preset(click.get_current_context(), preset, workload, plan_opts)
    if (dataset is None) == (workload is None):
        raise UserError("give either a DATASET or --workload pool|sliding-window")
    if dataset is not None:
        given = [k for k in (*POOL_ONLY, *SW_ONLY, "image_size", "seed") if plan_opts[k]]
        if given:
            raise UserError(f"--{given[0].replace('_', '-')} applies to --workload, not to a dataset")
    vm = _model(model, tokens_per_image, bytes_per_token, geometry)
    sem = Semantics(oversize=oversize, insert=insert, in_flight=in_flight, dispatch=dispatch,
                    real_width=real_width, target=target)
    sem.check()
    unit = sem.cache().unit
    if cache_gb and unit != "GiB":
        raise UserError(f"--cache {target} counts {unit}: give its capacity with --cache-size")
    caps_bytes = [int(round(g * GIB)) for g in _numbers(cache_gb, float, "--cache-gb")]
    caps_bytes += [sem.cache().capacity(x) for x in _numbers(cache_size, float, "--cache-size")]
    key = key or sem.cache().key
    caps_images = _numbers(cache_images, int, "--cache-images")
    unknown = _size(url_image_size)

    want_curve = bool(curve_path or plot_path)
    _check_outputs(dataset, curve_path, plot_path, force)
    if dataset is not None:
        trace, manifest = _dataset_trace(dataset, key, fmt, not no_manifest, quiet)
        if manifest:
            trace.info["manifest_path"] = manifest
        results = [({}, run(trace, vm, sem, caps_bytes, caps_images, unknown, want_curve))]
    else:
        results = _plan_results(workload, plan_opts, preset, want_curve,
                                lambda tr: run(tr, vm, sem, caps_bytes, caps_images, unknown,
                                               want_curve))
    if curve_path:
        write_curve(results[0][1], curve_path)
        if results[0][1].curve_sampled and not quiet:
            click.echo(f"note: with --insert completion the curve is simulated at "
                       f"{results[0][1].curve.capacity.size} capacities, not exact everywhere",
                       err=True)
    if plot_path:
        plot_curve(results[0][1], plot_path)
    if as_json:
        doc = results[0][1].summary if len(results) == 1 else [
            {"workload": p, **a.summary} for p, a in results]
        click.echo(to_json(doc).decode())
    elif len(results) == 1:
        click.echo(format_report(results[0][1]))
    else:
        click.echo(format_sweep(results))


def _check_outputs(dataset: Path | None, curve_path: Path | None, plot_path: Path | None,
                   force: bool) -> None:
    """--curve / --plot never overwrite an input, nor an existing file without --force."""
    outputs = [p for p in (curve_path, plot_path) if p is not None]
    if not outputs:
        return
    from ..io.atomic import check_not_input, check_target
    from ..io.manifest import manifest_path

    if dataset is not None:
        check_not_input(outputs, [dataset, manifest_path(dataset)])
    for out in outputs:
        check_target(out, force)


def _plan_results(workload: str | None, plan_opts: dict, preset: str | None, want_curve: bool,
                  run) -> list:
    """One analysis per workload plan of the sweep (``run`` analyses a trace)."""
    from ..analysis.trace import trace_from_plan

    results: list = []
    for params, plan in _plans(workload or "", plan_opts):
        if results and want_curve:
            raise UserError("--curve and --plot take a single workload, not a sweep")
        trace = trace_from_plan(plan)
        if preset:
            trace.source = f"{trace.source} of preset {preset}"
        results.append((params, run(trace)))
    return results
