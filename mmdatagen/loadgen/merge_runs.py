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

from ..errors import DatasetError, SpecError, UserError
from ..metrics import EXPORT_NAME, NONE, RECORDS_NAME, RecordTable
from .predict import CACHE_ITEMS_NAME


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


def _add_requests(path: Path, requests: list, lines: list[bytes], pairs: dict[tuple, tuple],
                  timeline: dict[str, Any]) -> None:
    """Append the requests of ``cache_items.jsonl`` lines (a cache item shared by many
    requests is one tuple in ``pairs``), their server cache events to ``timeline``."""
    from .predict import _Request

    try:
        for line in lines:
            d = orjson.loads(line)
            items = [pairs.setdefault(t, t) for t in map(tuple, d["items"])]
            requests.append(_Request(items, d["images"]))
            if d.get("seqs") is not None and d.get("x_request_id"):
                timeline[d["x_request_id"]] = d["seqs"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: not a {CACHE_ITEMS_NAME} line ({exc})") from None


def merged_prediction(workers: list[Worker], table: RecordTable) -> dict | None:
    """The prediction replayed over every worker's requests in the server's order; the
    per-request predictions go into ``table``."""
    from ..caches import get_target
    from ..vlm import generic_model
    from .predict import ImageTracker, prediction_result

    files = [w.path / CACHE_ITEMS_NAME for w in workers]
    if not all(f.is_file() for f in files):
        return {"note": "no merged prediction: a worker ran without one (--no-predict or no "
                        "model geometry)"}
    tracker: ImageTracker | None = None
    timeline: dict[str, Any] = {}
    model_name = ""
    slack: list[np.ndarray] = []  # per request: its worker's clock uncertainty (widens the band)
    pairs: dict[tuple, tuple] = {}  # one (key, size) per cache item (a million requests share few)
    for w, f in zip(workers, files):
        with open(f, "rb") as fh:
            head = _items_head(f, fh.readline())
            if tracker is None:
                model_name = head["model"]
                model = generic_model(1, int(head["bytes_per_token"]))
                tracker = ImageTracker(model, get_target(head["target"]), head["cache_size"],
                                       None, head["front"])
            before = len(tracker.requests)
            while lines := fh.readlines(1 << 22):
                _add_requests(f, tracker.requests, lines, pairs, timeline)
        unc = int((w.shard.get("clock") or {}).get("uncertainty_ns") or 0)
        slack.append(np.full(len(tracker.requests) - before, unc, np.int64))
    assert tracker is not None
    pred = prediction_result(tracker, None, table, len(tracker.requests),
                             timeline if timeline else None, np.concatenate(slack))
    if pred is not None and "model" in pred:  # the workers' model (sizes came with the items)
        pred["model"] = model_name
        pred.pop("geometry", None)
    return pred


def _read_tables(workers: list[Worker], processes: int) -> RecordTable:
    """Every worker's records, in shard order, read by ``processes``: this one and a pool
    (each of its processes sends back the tables it read; this one's own need no copy)."""
    from ..lifecycle import start_workers

    bases = np.cumsum([0] + [int(w.shard.get("dispatched") or 0) for w in workers])[:-1]
    jobs = list(zip(workers, map(int, bases)))
    with start_workers(processes - 1) if processes > 1 else contextlib.nullcontext() as pool:
        theirs = {k: pool.submit(_table, *job) for k, job in enumerate(jobs)
                  if pool and k % processes}
        mine = {k: _table(*job) for k, job in enumerate(jobs) if k not in theirs}
        return RecordTable.concat([mine[k] if k in mine else theirs[k].result()
                                   for k in range(len(jobs))])


def merge_runs(dirs: list[Path], output_dir: Path, force: bool = False,
               processes: int = 0) -> MergeRunsResult:
    """Join the workers in ``dirs`` into one export in ``output_dir``; ``processes`` (0: one per
    core, this one among them) read the workers' records (at most one per worker) and write
    the merged records."""
    from ..export import write_exports
    from ..io.atomic import check_not_input, check_target
    from ..lifecycle import pool_size, rare_full_collections

    if not dirs:
        raise SpecError("runs", "needs the worker folders to merge")
    workers = sorted((_load(Path(d)) for d in dirs), key=lambda w: w.index)
    check_workers(workers)
    out = Path(output_dir)
    check_target(out / EXPORT_NAME, force)
    check_not_input([out / EXPORT_NAME, out / RECORDS_NAME],
                    [w.path / n for w in workers for n in (EXPORT_NAME, RECORDS_NAME)])
    with rare_full_collections():
        table = _read_tables(workers, min(pool_size(processes), len(workers)))
        predicted = merged_prediction(workers, table)  # the last change to the table
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
