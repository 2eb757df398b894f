"""``mmdatagen merge-runs``: the sharded load workers of one benchmark (``bench --num-shards``)
joined into one export of the usual shape, as if one process had run it.

- Every record is put on the server's clock: a worker's monotonic times plus its wall offset
  (taken once in the run) plus its measured offset against the server (``loadgen/shard.py``).
- Percentiles are computed over the union of the records (never averaged); counts are summed.
- The cache prediction is replayed over every worker's requests together, in the order the
  server saw them: the simulator's cache timeline where the workers fetched it (exact), else
  start order on the one clock.
- Workers of different benchmarks (settings, dataset, shard count), a missing shard and a shard
  given twice are refused with one line.
- The workers' records are read by this process and a pool (one process per core; each sends
  back the tables it read). The merged records.jsonl is written in parts by this process and
  forked writers (``export.records_writer``: each of theirs into a file beside, appended in
  the kernel; no line crosses a pipe); the export's maths run while the writers start.
- The cycle collector's full collections wait for the end of the merge
  (``lifecycle.rare_full_collections``): it builds millions of objects without cycles
  (records, cache items, the band's events), which they would scan again and again.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ..caches.items import RequestItems
from ..errors import DatasetError, SpecError, UserError
from ..metrics import EXPORT_NAME, NONE, RECORDS_NAME, RecordTable
from .predict import CACHE_ITEMS_NAME, RequestColumns


@dataclass
class Worker:
    path: Path
    export: dict
    shard: dict

    @property
    def index(self) -> int:
        return int(self.shard["index"])

    @property
    def clock_ns(self) -> int:
        """Add to this worker's record times to get the server's Unix clock."""
        offset = (self.shard.get("clock") or {}).get("offset_ns") or 0
        return int(self.shard["wall_offset_ns"]) + int(offset)


@dataclass
class MergeRunsResult:
    export: dict
    records: RecordTable
    paths: dict[str, Path]
    workers: int


def _load(path: Path) -> Worker:
    file = Path(path) / EXPORT_NAME
    try:
        export = orjson.loads(file.read_bytes())
    except FileNotFoundError:
        raise UserError(f"{path}: no {EXPORT_NAME} (not a bench run folder)") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise DatasetError(f"{file}: unreadable export ({exc})") from None
    shard = (export.get("run_info") or {}).get("shard") if isinstance(export, dict) else None
    if not isinstance(shard, dict) or not isinstance(shard.get("index"), int):
        raise UserError(f"{path}: not a load worker's run (bench --num-shards N --shard-index K)")
    return Worker(Path(path), export, shard)


def check_workers(workers: list[Worker]) -> None:
    """One benchmark, every shard once."""
    first = workers[0].shard
    for w in workers[1:]:
        for key, what in (("count", "shard count"), ("settings_blake3", "settings"),
                          ("dataset_blake3", "dataset")):
            if w.shard.get(key) != first.get(key):
                raise UserError(f"{w.path} and {workers[0].path} are from different benchmarks "
                                f"(their {what} differ)")
    count = int(first["count"])
    seen: dict[int, Path] = {}
    for w in workers:
        if w.index in seen:
            raise UserError(f"shard {w.index} is given twice: {seen[w.index]} and {w.path}")
        seen[w.index] = w.path
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise UserError(f"shard{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(str, missing))} of {count} missing")


def _table(w: Worker, base: int) -> RecordTable:
    """A worker's records on the server's clock, dispatch indexes into the merged sequence."""
    from ..export import read_records

    try:
        t = read_records(w.path / RECORDS_NAME)
    except FileNotFoundError:
        raise UserError(f"{w.path}: no {RECORDS_NAME}") from None
    by = w.clock_ns
    for name in ("start_ns", "first_token_ns", "end_ns", "response_end_ns"):
        col = t.cols[name]
        col[col != NONE] += by
    col = t.cols["dispatch_index"]
    col[col != NONE] += base
    return t


def _items_head(path: Path, line: bytes) -> dict:
    """The header of a worker's ``cache_items.jsonl``: its cache and model geometry."""
    try:
        head = orjson.loads(line)
        if not isinstance(head, dict):
            raise TypeError("not an object")
        missing = [k for k in ("target", "cache_size", "front", "bytes_per_token", "model")
                   if k not in head]
        if missing:
            raise KeyError(missing[0])
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: not a {CACHE_ITEMS_NAME} header ({exc})") from None
    return head


@dataclass
class _Items:
    """One worker's ``cache_items.jsonl`` as columns: its header, its requests' items (key ids
    local to it: ``names`` gives each id's key), their image counts, and the simulator's cache
    events per X-Request-ID where it fetched them."""

    head: dict
    names: list
    items: RequestItems
    images: np.ndarray
    timeline: dict[str, Any]


def _items(w: Worker) -> _Items | None:
    """A worker's cache items, or None without the file (a worker ran without a prediction)."""
    path = w.path / CACHE_ITEMS_NAME
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return None
    ids: dict[Any, int] = {}
    key: list[int] = []
    size: list[int] = []
    count: list[int] = []
    images: list[int] = []
    timeline: dict[str, Any] = {}
    with fh:
        head = _items_head(path, fh.readline())
        try:
            while lines := fh.readlines(1 << 22):
                for line in lines:
                    d = orjson.loads(line)
                    its = d["items"]
                    count.append(len(its))
                    for k, sz in its:
                        key.append(ids.setdefault(k, len(ids)))
                        size.append(sz)
                    images.append(d["images"])
                    if d.get("seqs") is not None and d.get("x_request_id"):
                        timeline[d["x_request_id"]] = d["seqs"]
            start = np.zeros(len(count) + 1, np.int64)
            np.cumsum(count, out=start[1:])
            sizes, counts = (np.array(v) if v else np.zeros(0, np.int64) for v in (size, images))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError,
                OverflowError) as exc:
            raise DatasetError(f"{path}: not a {CACHE_ITEMS_NAME} line ({exc})") from None
    if sizes.dtype.kind != "i" or counts.dtype.kind != "i" or (sizes < 0).any() or (
            counts < 0).any():
        raise DatasetError(f"{path}: not a {CACHE_ITEMS_NAME} file (an item size or image "
                           "count that is not a whole number of 0 or more)")
    return _Items(head, list(ids), RequestItems(start, np.array(key, np.int64), sizes),
                  counts, timeline)


def _joined(parts: list[_Items]) -> RequestColumns:
    """The workers' requests one after the other, their keys' ids shared (equal keys, one id)."""
    ids: dict[Any, int] = {}
    shared = [RequestItems(p.items.start, np.array([ids.setdefault(k, len(ids)) for k in p.names],
                                                   np.int64)[p.items.key], p.items.size)
              for p in parts]
    return RequestColumns(RequestItems.concat(shared), np.concatenate([p.images for p in parts]))


def merged_prediction(workers: list[Worker], table: RecordTable,
                      parts: list[_Items | None]) -> dict | None:
    """The prediction replayed over every worker's requests (``parts``: their cache items) in
    the server's order; the per-request predictions go into ``table``. Its order band is left
    for ``predict.settle_band`` (made with the export, while the forked writers write)."""
    from ..caches import get_target
    from ..vlm import generic_model
    from .predict import ImageTracker, prediction_result

    if any(p is None for p in parts):
        return {"note": "no merged prediction: a worker ran without one (--no-predict or no "
                        "model geometry)"}
    have = [p for p in parts if p is not None]
    head = have[0].head
    tracker = ImageTracker(generic_model(1, int(head["bytes_per_token"])),
                           get_target(head["target"]), head["cache_size"], None, head["front"])
    tracker.requests = _joined(have)
    timeline = {x: seqs for p in have for x, seqs in p.timeline.items()}
    # per request: its worker's clock uncertainty (widens the band)
    slack = np.concatenate([np.full(len(p.items), int((w.shard.get("clock") or {}).get(
        "uncertainty_ns") or 0), np.int64) for w, p in zip(workers, have)])
    pred = prediction_result(tracker, None, table, len(tracker.requests),
                             timeline if timeline else None, slack, band_later=True)
    if pred is not None and "model" in pred:  # the workers' model (sizes came with the items)
        pred["model"] = head["model"]
        pred.pop("geometry", None)
    return pred


def _read(w: Worker, base: int) -> tuple[RecordTable, _Items | None]:
    """A worker's records (``_table``) and cache items."""
    return _table(w, base), _items(w)


def _read_workers(workers: list[Worker], processes: int
                  ) -> tuple[RecordTable, list[_Items | None]]:
    """Every worker's records (in shard order) and cache items, read by ``processes``: this
    one and a pool (each of its processes sends back what it read; this one's own need no
    copy)."""
    from ..lifecycle import start_workers

    bases = np.cumsum([0] + [int(w.shard.get("dispatched") or 0) for w in workers])[:-1]
    jobs = list(zip(workers, map(int, bases)))
    with start_workers(processes - 1) if processes > 1 else contextlib.nullcontext() as pool:
        theirs = {k: pool.submit(_read, *job) for k, job in enumerate(jobs)
                  if pool and k % processes}
        mine = {k: _read(*job) for k, job in enumerate(jobs) if k not in theirs}
        got = [mine[k] if k in mine else theirs[k].result() for k in range(len(jobs))]
    return RecordTable.concat([t for t, _ in got]), [items for _, items in got]


def merge_runs(dirs: list[Path], output_dir: Path, force: bool = False,
               processes: int = 0) -> MergeRunsResult:
    """Join the workers in ``dirs`` into one export in ``output_dir``; ``processes`` (0: one per
    core, this one among them) read the workers' records (at most one per worker) and write
    the merged records."""
    from ..io.atomic import remove_stale, writing

    if not dirs:
        raise SpecError("runs", "needs the worker folders to merge")
    workers = sorted((_load(Path(d)) for d in dirs), key=lambda w: w.index)
    check_workers(workers)
    out = Path(output_dir)
    # one writer of the folder: the temporaries a killed merge left in it go; the workers'
    # files are inputs, never replaced
    inputs = [w.path / n for w in workers for n in (EXPORT_NAME, RECORDS_NAME, CACHE_ITEMS_NAME)]
    with writing(out, [out / EXPORT_NAME, out / RECORDS_NAME], inputs):
        for name in (EXPORT_NAME, RECORDS_NAME):
            remove_stale(out / name)
        return _merge(workers, out, force, processes)


def _merge(workers: list[Worker], out: Path, force: bool, processes: int) -> MergeRunsResult:
    """``merge_runs`` once it holds the output folder."""
    from ..export import write_exports
    from ..io.atomic import check_target
    from ..lifecycle import large_frees_to_os, pool_size, rare_full_collections

    check_target(out / EXPORT_NAME, force)
    large_frees_to_os()  # the prediction churns arrays of a million entries
    with rare_full_collections():
        table, items = _read_workers(workers, min(pool_size(processes), len(workers)))
        predicted = merged_prediction(workers, table, items)  # the last change to the table
        del items
        # the export's maths run while forked writers serialise the records
        export = functools.cache(lambda: _merged_export(workers, table, predicted))
        paths = write_exports(out, table, export, processes=pool_size(processes))
        return MergeRunsResult(export(), table, paths, len(workers))


def _merged_export(workers: list[Worker], table: RecordTable, predicted: dict | None) -> dict:
    """The export of the merged ``table``: the prediction replayed over all workers
    (``predicted``), the first worker's settings (without its shard), goodput under its
    SLOs."""
    from ..export import build_export
    from ..report.aggregate import run_aggregates
    from .predict import settle_band

    predicted = settle_band(predicted)
    first = workers[0].export
    config = dict(first.get("input_config") or {})
    config.pop("shard_index", None)
    run_info = {"merged_runs": [str(w.path) for w in workers], "workers": len(workers),
                "clock": "the server's (each worker: wall offset + measured offset)",
                "shards": [w.shard for w in workers],
                "note": "server /metrics deltas are per worker (their windows overlap): see "
                        "each worker's export"}
    export = build_export(table, input_config=config, run_info=run_info,
                          was_cancelled=any(w.export.get("was_cancelled") for w in workers),
                          wall_offset_ns=0, predicted=predicted)
    export.update(run_aggregates(table))
    slos = (first.get("goodput") or {}).get("slos") if isinstance(first.get("goodput"),
                                                                  dict) else None
    if slos:
        from .goodput import export_goodput

        export.update(export_goodput(table, export, slos))
    return export
