"""Orchestration of one benchmark: target, dispatch, progress, SIGINT, cache evidence, exports."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..console import console_table
from ..errors import RunFailed, SpecError, UserError
from ..export import build_export, write_exports
from ..io.readers import detect_format, iter_turns
from ..lifecycle import raise_stopped, rare_full_collections, run_loop
from ..metrics import NONE, RecordTable, as_table
from ..scheduling import slots_for
from .client import make_client
from .dispatch import Context, Scheduler, fixed_schedule, worker
from .payload import ENDPOINT_PATHS, BodyConfig, ImageEncoder
from .predict import (
    CACHE_ITEMS_NAME,
    cache_item_lines,
    observe_order,
    prediction_result,
    prediction_setup,
)
from .scrape import MetricsSampler, counter_delta, parse_cache_counters, scrape_metrics  # noqa: F401
from .shard import Shard, file_digest, worker_run, worker_start

if TYPE_CHECKING:
    from ..settings.run import BenchRun
    from ..settings.sim import Simulator

@dataclass
class BenchResult:
    export: dict
    records: list
    paths: dict
    table: str
    stopped_by: int | None = None  # the signal that stopped the run (its export is partial)


def failed_run(export: dict) -> str | None:
    """Why a run has no result (every request failed), or None. Bench, ab and sweep (resumed
    runs too) ask this one question of an export."""
    ok = (export.get("request_count") or {}).get("avg") or 0
    errors = (export.get("error_request_count") or {}).get("avg") or 0
    if ok or not errors:
        return None
    summary: list[dict] = [e["error_details"] for e in export.get("error_summary") or ()
                           if isinstance(e, dict) and isinstance(e.get("error_details"), dict)]
    first = summary[0] if summary else {}
    what = " ".join(str(first[k]) for k in ("code", "type") if first.get(k) is not None)
    message = " ".join(str(first.get("message") or "").split())[:160]
    return f"every request failed ({errors:,} errors" + (
        f"; most often {what}: {message}" if what or message else "") + ")"


def finish_run(result: BenchResult, what: str = "the run") -> None:
    """After a run's exports are written: stop as its signal would (exit 143 or 130), or fail
    (exit 1) when every request failed; the one place bench, ab and sweep decide this."""
    if result.stopped_by is not None:
        raise_stopped(result.stopped_by)
    problem = failed_run(result.export)
    if problem is not None:
        folder = Path(result.paths["export"]).parent if result.paths.get("export") else "?"
        raise RunFailed(f"{what}: {problem}; exports in {folder}")


def check_run(run: BenchRun) -> None:
    """What ``run_bench`` checks before it starts anything: the specs have checked their own
    fields, these need several specs or the disk (``setup.bench_run`` adds the simulator's
    settings and the outputs, so ``ab`` checks both runs whole before either starts). The
    start time and the worker's share are checked by ``shard.worker_run``, the outputs again
    under the folder's lock (``io.atomic.writing``)."""
    from ..settings.base import validate

    load, url = run.load, run.target.url
    if not Path(load.input_file).is_file():
        raise UserError(f"input file not found: {load.input_file}")
    if load.model is None:  # setup.bench_run names the simulator's model
        raise SpecError("model", "is required" + (" with `url`" if url else ""))
    for part in (load, run.shard):  # a run made in code: its specs checked as the CLI's are
        validate(part)
    if load.ramp_to is not None and not (load.benchmark_duration or load.request_count
                                         or load.dataset_type != "random_pool"):
        raise SpecError("ramp_to", "needs `benchmark_duration` or `request_count` with a "
                        "random_pool dataset (the span of the ramp)")
    if run.target.metrics_url is not None:
        if not url:
            raise SpecError("metrics_url", "needs url (the embedded simulator's counters are "
                                           "its own)")
        if not run.target.metrics_url.startswith(("http://", "https://")):
            raise SpecError("metrics_url", "must start with http:// or https://")
    out = Path(run.target.output_dir)
    if out.exists() and not out.is_dir():
        raise SpecError("output_dir", f"{out} exists and is not a folder")


def run_outputs(out: Path) -> list[Path]:
    """Every path a run writes in its folder (its export, records, cache items, report and
    plots): none may be an input of the run."""
    from ..metrics import EXPORT_NAME, RECORDS_NAME
    from ..report.html import PLOTS_DIR, REPORT_NAME

    return [out / name for name in (EXPORT_NAME, RECORDS_NAME, CACHE_ITEMS_NAME, REPORT_NAME,
                                     PLOTS_DIR)]


class Progress:
    """tqdm on stderr: requests done, errors, live throughput; off when quiet or not a TTY."""

    def __init__(self, ctx: Context, total: int | None, enabled: bool) -> None:
        self.ctx = ctx
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True,
                            desc="bench")

    async def run(self) -> None:
        if self.bar is None:
            return
        shown = 0
        t0, n0 = time.monotonic(), 0
        while True:
            await asyncio.sleep(0.25)
            self.update(shown)
            shown = self.ctx.done
            now = time.monotonic()
            if now - t0 >= 1.0:
                self.bar.set_postfix(errors=self.ctx.errors, rps=f"{(shown - n0) / (now - t0):.0f}",
                                     refresh=False)
                t0, n0 = now, shown

    def update(self, shown: int) -> None:
        if self.bar is not None:
            self.bar.update(self.ctx.done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.update(0)
            self.bar.close()


def to_simulated_time(records: list, scale: float) -> None:
    """Rescale wall-clock records to the simulator's time (simulated = wall / time_scale)."""
    if scale == 1.0 or not records:
        return
    base = min(r.start_ns for r in records)

    def conv(t: int | None) -> int | None:
        return None if t is None else base + round((t - base) / scale)

    for r in records:
        r.start_ns, r.first_token_ns = conv(r.start_ns), conv(r.first_token_ns)
        r.end_ns, r.response_end_ns = conv(r.end_ns), conv(r.response_end_ns)
        if r.server_ttft_ns is not None:
            r.server_ttft_ns = round(r.server_ttft_ns / scale)


class _Stopper:
    """Ctrl-C and SIGTERM during a run: stop issuing, let in-flight requests finish for the
    grace period (Ctrl-C; a second one stops at once) or stop them now (SIGTERM: Kubernetes
    and Docker follow it with SIGKILL), then write the partial export."""

    def __init__(self, loop, sched, ctx: Context, tasks: list, grace: float) -> None:
        self.loop, self.sched, self.ctx, self.tasks, self.grace = loop, sched, ctx, tasks, grace
        self.presses = 0
        self.cancelled = False
        self.signum: int | None = None  # the first signal: the run's exit code follows it
        self.guarded: asyncio.Future | None = None

    def cancel_all(self) -> None:
        for t in self.tasks:
            t.cancel()

    def on_signal(self, terminate: bool) -> None:
        self.presses += 1
        self.cancelled = True
        if self.signum is None:
            self.signum = signal.SIGTERM if terminate else signal.SIGINT
        self.sched.stop()
        if self.guarded is not None and not self.guarded.done():
            self.guarded.cancel()
        if terminate or self.presses > 1:
            self.cancel_all()
        else:
            print(f"\ninterrupted: no new requests; waiting up to {self.grace:g} s for "
                  f"{self.ctx.in_flight} in flight (Ctrl-C again to stop now)", file=sys.stderr)
            self.loop.call_later(self.grace, self.cancel_all)

    async def guard(self, coro):
        """Await ``coro`` unless a signal arrives first (then None)."""
        if self.cancelled and self.presses > 1:
            coro.close()
            return None
        self.guarded = asyncio.ensure_future(coro)
        try:
            return await self.guarded
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.guarded.cancelled() and task is not None and task.cancelling() == 0:
                return None
            raise
        finally:
            self.guarded = None

    def installed(self):
        return _loop_signals(self.loop, lambda sig: self.on_signal(sig == signal.SIGTERM))


@contextlib.contextmanager
def _loop_signals(loop, handler):
    """Ctrl-C and SIGTERM handled by ``handler(signum)`` on ``loop`` inside the block (not
    raised), the process's own handlers back after it."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, handler, sig)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
            with contextlib.suppress(TypeError, ValueError):
                signal.signal(sig, previous[sig])  # asyncio resets to the default


@dataclass
class _Session:
    """Everything one run sets up before the first request: source, schedule, client, tracker."""

    run: BenchRun
    sim: Simulator | None  # the embedded simulator's settings (None: the run has a url)
    fmt: str
    encoder: ImageEncoder
    source: Any
    sched: Scheduler
    client: Any
    ctx: Context
    count: int | None
    tracker: Any = None
    note: str | None = None
    clock: dict | None = None  # a sharded worker's clock against the server's

    def open_turns(self):
        return iter_turns(Path(self.run.load.input_file), self.fmt)


@dataclass
class _Drive:
    """What running the requests left behind: scrapes, clock offset, crashes, the sampler."""

    before: Any
    after: Any
    wall_offset: int
    crashes: list
    sampler: Any
    n_workers: int
    cancelled: bool
    reset: dict | None = None  # --reset-cache: what the server's reset endpoints answered
    stopped_by: int | None = None  # the signal that stopped the run


def _session(run: BenchRun, url: str, sim: Simulator | None) -> _Session:
    from .sessions import SessionSource

    load = run.load
    assert load.model is not None, "check_run refuses a run without a model"
    path = Path(load.input_file)
    fmt = load.dataset_type if load.dataset_type != "auto" else detect_format(path)
    encoder = ImageEncoder(path.resolve().parent, max_bytes=run.image_cache_bytes)
    wrap = load.request_count is not None or load.benchmark_duration is not None
    shard = Shard(run.shard.shard_index, run.shard.num_shards)
    seed = shard.seed(load.seed)
    source = SessionSource(lambda: iter_turns(path, fmt), fmt, wrap=wrap, seed=load.seed,
                           shard=(shard.index, shard.count))
    count = load.request_count
    if fmt == "random_pool" and count is None and load.benchmark_duration is None:
        count = len(source._pool or ())  # one draw per pool entry by default
    headers = dict(load.header_map)
    if load.api_key:
        headers["Authorization"] = f"Bearer {load.api_key}"
    client, target = make_client(load.http_client, url, timeout_s=load.request_timeout,
                                 headers=headers, max_response_bytes=run.max_response_bytes)
    endpoint = target.path_for(ENDPOINT_PATHS[load.endpoint_type])
    body_cfg = BodyConfig(model=load.model, endpoint_type=load.endpoint_type,
                          streaming=load.streaming,
                          extra_inputs=dict(load.extras))
    sched = Scheduler(warmup=load.warmup_request_count, count=count, rate=load.request_rate,
                      arrival=load.arrival, duration_s=load.benchmark_duration, seed=seed,
                      burstiness=load.burstiness, ramp_to=load.ramp_to)
    ctx = Context(client=client, path=endpoint, body_cfg=body_cfg, encoder=encoder,
                  source=source, sched=sched, multi_turn=fmt == "multi_turn")
    tracker, note = ((None, "prediction off (--no-predict)") if load.no_predict else
                     prediction_setup(load.model, run.cache, run.geometry, encoder, sim))
    if tracker is not None:
        ctx.on_start = tracker.on_start
    return _Session(run, sim, fmt, encoder, source, sched, client, ctx, count, tracker, note)


def _start(s: _Session, stop: Any, tasks: list) -> int:
    """Start the worker tasks (one per slot, or the fixed-schedule driver); the slot count."""
    load = s.run.load
    n_workers = slots_for(load.concurrency, load.request_rate)
    if stop.cancelled:
        pass  # stopped during the first scrape: no request is sent
    elif load.fixed_schedule:
        n_workers = load.concurrency or 0
        tasks.append(asyncio.ensure_future(fixed_schedule(s.ctx, s.open_turns(),
                                                          load.request_count, load.concurrency)))
    else:
        tasks.extend(asyncio.ensure_future(worker(s.ctx)) for _ in range(n_workers))
    return n_workers


def _target_metrics(s: _Session) -> dict:
    """The counter names of the cache the run predicts (they pick the scraped family)."""
    if s.tracker is not None:
        return s.tracker.target.metrics
    from ..caches import get_target

    return get_target(s.run.cache.target_name).metrics


async def _drive(s: _Session, url: str) -> _Drive:
    """Run every request with progress, /metrics sampling and Ctrl-C / SIGTERM handling."""
    load = s.run.load
    tasks: list[asyncio.Future] = []
    stop = _Stopper(asyncio.get_running_loop(), s.sched, s.ctx, tasks, load.grace_period)
    with stop.installed():  # Ctrl-C and SIGTERM from here on: a partial export, never none
        reset = await stop.guard(_reset(load.quiet, url)) if load.reset_cache else None
        sampler = MetricsSampler(s.run.target.metrics_url or url, load.metrics_interval,
                                 quiet=load.quiet)
        before = await stop.guard(sampler.start())
        wall_offset = time.time_ns() - time.perf_counter_ns()
        total = None if s.count is None else s.count + load.warmup_request_count
        progress = Progress(s.ctx, total, enabled=not load.quiet and sys.stderr.isatty())
        with rare_full_collections():  # no collector pause inside the measured requests
            n_workers = _start(s, stop, tasks)
            prog_task = asyncio.ensure_future(progress.run())
            try:
                results = await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                prog_task.cancel()
                progress.close()
                await s.client.close()
        crashes = [r for r in results if isinstance(r, BaseException)
                   and not isinstance(r, asyncio.CancelledError)]
        after = None
        if tasks:  # stopped before any request: no 'after' counters to take
            last = sampler.stop()
            if stop.cancelled:  # stopping: a slow /metrics may not hold the exit up
                last = asyncio.wait_for(last, 1.0)
            with contextlib.suppress(asyncio.TimeoutError):
                after = await stop.guard(last)
        await sampler.close()  # also when a second signal cut the last scrape short
    return _Drive(before, after, wall_offset, crashes, sampler, n_workers, stop.cancelled,
                  reset, stop.signum)


async def _reset(quiet: bool, url: str) -> dict:
    """--reset-cache, before warmup; says at once when the server cannot be reset."""
    from .reset import reset_server_caches

    out = await reset_server_caches(url)
    if not out["reset"] or not quiet:
        print(("" if out["reset"] else "warning: ") + f"--reset-cache: {out['note']}",
              file=sys.stderr)
    return out


def _run_info(s: _Session, url: str, d: _Drive, embedded: bool, scale: float) -> dict[str, Any]:
    info: dict[str, Any] = {
        "url": url, "endpoint": s.ctx.path, "dataset_format": s.fmt, "workers": d.n_workers,
        "http_client": type(s.client).__name__, "requests_started": s.ctx.started,
        "files_encoded": s.encoder.encoded, "dataset_passes": s.source.passes,
        "dataset_rows_read": s.source.rows_read, "embedded_simulator": embedded,
        "time_scale": scale, "times_in": "simulated time (wall / time_scale)" if scale != 1.0
        else "wall time",
        "output_tokens_source": "server usage when present, else content chunks "
                                "(streaming) / words (non-streaming)",
        "input_tokens_source": "server usage.prompt_tokens (includes image tokens) when present",
    }
    if d.crashes:
        info["worker_crashes"] = [repr(c)[:300] for c in d.crashes]
    if d.reset is not None:
        info["cache_reset"] = d.reset
    if s.run.shard.num_shards > 1:
        info["shard"] = _shard_info(s, d)
    return info


def _shard_info(s: _Session, d: _Drive) -> dict[str, Any]:
    """What merge-runs needs of a worker: which one, the benchmark it belongs to, its clocks."""
    shard = s.run.shard
    return {"index": shard.shard_index, "count": shard.num_shards, "start_at": shard.start_at,
            "settings_blake3": s.run.shard_digest,
            "dataset_blake3": file_digest(s.run.load.input_file), "wall_offset_ns": d.wall_offset,
            "clock": s.clock, "dispatched": s.ctx.started,
            "cache_items": CACHE_ITEMS_NAME if s.tracker is not None else None}


def _wall_span(records: list, wall_offset: int) -> tuple[int, int] | None:
    if not records:
        return None
    return (min(r.start_ns for r in records) + wall_offset,
            max((r.response_end_ns or r.start_ns) for r in records) + wall_offset)


async def _predicted(s: _Session, url: str, records: list, table: RecordTable
                     ) -> dict | None:
    """The cache prediction of the run: the tracker replayed in the order the server's
    timeline, its log or the first tokens give (``table``: the records as columns; the
    predicted hits go into both)."""
    run = s.run
    timeline = None
    if s.tracker is not None:
        timeline = await observe_order(s.tracker, url, records, run.load.server_log)
    predicted = prediction_result(s.tracker, s.note, table, s.ctx.started, timeline)
    for r, hits in zip(records, table.predicted_hits.tolist()):
        r.predicted_hits = None if hits == NONE else hits
    if predicted is not None and run.shard.num_shards > 1 and "hits" in predicted:
        predicted["note"] = ("this worker's requests alone, from a cold cache; the server saw "
                             "every worker's: merge-runs predicts the whole benchmark")
    return predicted


async def _export(s: _Session, url: str, d: _Drive
                  ) -> tuple[dict[str, Any], RecordTable, dict[str, Iterable[bytes]] | None]:
    """The export document of the run (records rescaled to simulated time when embedded), the
    records as the table it was built from (``records.jsonl`` is written from it) and the
    extra files beside it (a sharded worker's cache items). What the loader knows of the run
    (prediction, scrapes, the worker's cache items) is taken first, then the document is
    built from it."""
    run, records, embedded = s.run, s.ctx.records, s.sim is not None
    prof_starts = [r.start_ns for r in records if r.phase == "profiling"]
    span = _wall_span(records, d.wall_offset)
    scale = run.load.time_scale if embedded else 1.0
    to_simulated_time(records, scale)
    table = as_table(records)  # the prediction and the export read the same columns
    predicted = await _predicted(s, url, records, table)
    extra: dict[str, Iterable[bytes]] | None = None
    if run.shard.num_shards > 1 and s.tracker is not None:
        extra = {CACHE_ITEMS_NAME: cache_item_lines(s.tracker, records)}
    counters = _target_metrics(s)
    scraped = counter_delta(d.before, d.after, counters)
    series = d.sampler.series(min(prof_starts) if prof_starts else None, scale)
    info = _run_info(s, url, d, embedded, scale)
    export = build_export(table, input_config=run.public(), run_info=info,
                          was_cancelled=d.cancelled or s.ctx.fatal is not None,
                          wall_offset_ns=d.wall_offset, predicted=predicted, scraped=scraped,
                          wall_span_ns=span)
    export["server_metrics_timeseries"] = series
    export["server_stages"] = d.sampler.stages()
    if run.slos:
        from .goodput import export_goodput

        export.update(export_goodput(records, export, dict(run.slos)))
    from ..report.aggregate import run_aggregates

    export.update(run_aggregates(records))
    return export, table, extra


async def _run_async(run: BenchRun, url: str, sim: Simulator | None = None,
                     driving: list | None = None) -> BenchResult:
    """The run against ``url`` (the embedded simulator with settings ``sim``, or the run's
    server); ``driving`` gets an item once the requests start (before it, a Ctrl-C or
    SIGTERM raises, and ``_run_with_target`` writes the unstarted export)."""
    s = _session(run, url, sim)
    s.clock = await worker_start(url, run.shard)
    if driving is not None:
        driving.append(True)
    d = await _drive(s, url)
    late: list[int] = []  # a signal while the export is written: acted on once it is written

    def hold(signum: int) -> None:
        if not late and not run.load.quiet:
            print("\nstopping once the export is written", file=sys.stderr)
        late.append(signum)

    with _loop_signals(asyncio.get_running_loop(), hold):
        export, table, extra = await _export(s, url, d)
        out = Path(run.target.output_dir)
        paths = write_exports(out, table, export, extra)
    if s.ctx.fatal is not None:
        raise UserError(f"{s.ctx.fatal} (run stopped; partial exports in {out})")
    stopped = d.stopped_by if d.stopped_by is not None else (late[0] if late else None)
    return BenchResult(export, s.ctx.records, paths, console_table(export), stopped)


def run_bench(run: BenchRun) -> BenchResult:
    """Run one benchmark (starting the embedded simulator when the run has no ``url``); a
    sharded worker runs its share (``loadgen/shard.py``). In turn: the run checked, this
    process's part of it, its folder taken (one writer; no output is an input), then the run."""
    from ..io.atomic import writing

    check_run(run)
    part = worker_run(run)
    out = Path(part.target.output_dir)
    with writing(out, run_outputs(out), [part.load.input_file]):
        return _run_with_target(part)


def _run_with_target(run: BenchRun) -> BenchResult:
    """The run against its server (the embedded simulator when it has no ``url``). Stopped
    before its first request (while the simulator starts, the dataset is read, a worker waits
    for its start): an empty, cancelled export."""
    driving: list = []
    try:
        with _server(run) as (url, sim):
            return run_loop(_run_async(run, url, sim, driving))
    except KeyboardInterrupt:
        if not driving:
            _write_unstarted(run)
        raise


@contextlib.contextmanager
def _server(run: BenchRun) -> Iterator[tuple[str, Simulator | None]]:
    """The run's server: its url, or the embedded simulator started for it (``None`` or the
    simulator's settings beside the address; derived once: the server and the prediction
    take the same)."""
    if run.target.url:
        yield run.target.url, None
        return
    from ..sim.embedded import EmbeddedServer

    sim = run.simulator()
    with EmbeddedServer(sim) as srv:  # started inside the caller's guard: no unguarded moment
        yield srv.url, sim


def _write_unstarted(run: BenchRun) -> None:
    """The export of a run stopped before its first request (was_cancelled, no records)."""
    export = build_export([], input_config=run.public(), run_info={"requests_started": 0},
                          was_cancelled=True)
    write_exports(Path(run.target.output_dir), [], export)
