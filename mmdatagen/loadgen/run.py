"""Orchestration of one benchmark: target, dispatch, progress, SIGINT, cache evidence, exports."""
from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..console import console_table
from ..errors import RunFailed, SpecError, UserError
from ..export import build_export, write_exports
from ..io.readers import detect_format, iter_turns
from ..lifecycle import raise_stopped
from .client import make_client
from .dispatch import Context, Scheduler, fixed_schedule, worker
from .failures import DEFAULT_MAX_RESPONSE_BYTES
from .payload import ENDPOINT_PATHS, BodyConfig, ImageEncoder
from .predict import (
    CACHE_ITEMS_NAME,
    cache_item_lines,
    fetch_timeline,
    prediction_result,
    prediction_setup,
)
from .scrape import MetricsSampler, counter_delta, parse_cache_counters, scrape_metrics  # noqa: F401
from .shard import (
    Shard,
    file_digest,
    probe_clock,
    seconds_to_start,
    settings_digest,
    shard_config,
)

SECRET_HEADER = re.compile(r"authorization|api[-_]?key|token|secret|cookie", re.IGNORECASE)
RATE_DEFAULT_CAP = 1024


@dataclass
class BenchConfig:
    """Everything one ``mmdatagen bench`` run needs (CLI flags, resolved)."""

    input_file: Path
    model: str
    url: str | None = None
    dataset_type: str = "auto"
    concurrency: int | None = None
    request_count: int | None = None
    warmup_request_count: int = 0
    extra_inputs: dict[str, Any] = field(default_factory=dict)
    streaming: bool = False
    output_dir: Path = Path("artifacts/bench")
    request_rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0  # gamma's shape (--arrival gamma)
    ramp_to: float | None = None  # the rate a linear ramp ends at
    benchmark_duration: float | None = None
    request_timeout: float = 600.0
    headers: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    endpoint_type: str = "chat"
    profile: str = "qwen3-vl-30b-gb200"
    cache_gb: float | None = 10.0  # the target's capacity in its own unit; None: its default
    cache: str = "dynamo-embedding"
    cache_explicit: bool = False  # --cache given (the embedded simulator then runs it)
    encoder_budget: int | None = None  # a two-tier target's front in tokens; None: vLLM's rule
    metrics_url: str | None = None  # where the cache counters are scraped; None: the server's
    reset_cache: bool = False  # --reset-cache: the server's caches emptied before warmup
    num_shards: int = 1  # load workers sharing the benchmark (loadgen/shard.py)
    shard_index: int = 0
    start_at: float | None = None  # Unix seconds every worker waits for
    shard_digest: str | None = None  # the undivided benchmark's settings (merge-runs checks)
    model_path: str | None = None
    geometry: dict[str, int] = field(default_factory=dict)
    sim_args: list[str] = field(default_factory=list)
    time_scale: float = 1.0
    http_client: str = "raw"
    grace_period: float = 30.0
    seed: int = 0
    quiet: bool = False
    predict: bool = True
    fixed_schedule: bool = False
    image_cache_bytes: int = 1 << 30
    goodput: dict[str, float] = field(default_factory=dict)  # SLO tag -> objective (goodput.py)
    metrics_interval: float = 1.0  # seconds between /metrics scrapes during the run
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES  # larger: ResponseTooLarge, not read

    def public(self) -> dict[str, Any]:
        """The config as written to exports: no API key, secret-looking headers redacted."""
        d = asdict(self)
        d.pop("api_key", None)
        d["api_key_set"] = self.api_key is not None
        d["headers"] = {k: ("<redacted>" if SECRET_HEADER.search(k) else v)
                        for k, v in self.headers.items()}
        d["input_file"] = str(self.input_file)
        d["output_dir"] = str(self.output_dir)
        return d


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


def validate_config(cfg: BenchConfig) -> None:
    """Checks that need the resolved config (the spec layer has checked every number)."""
    if not Path(cfg.input_file).is_file():
        raise UserError(f"input file not found: {cfg.input_file}")
    from ..spec.base import check_values
    from ..spec.load import Load

    check_values(Load, concurrency=cfg.concurrency, request_count=cfg.request_count,
                 warmup_request_count=cfg.warmup_request_count, request_rate=cfg.request_rate,
                 benchmark_duration=cfg.benchmark_duration, time_scale=cfg.time_scale,
                 request_timeout=cfg.request_timeout, grace_period=cfg.grace_period,
                 seed=cfg.seed)
    if cfg.max_response_bytes < 1024:
        raise SpecError("max_response_mb", "must be at least 0.001 (1 KiB)")
    if cfg.endpoint_type not in ENDPOINT_PATHS:
        raise SpecError("endpoint_type", f"must be one of {', '.join(ENDPOINT_PATHS)}")
    if cfg.fixed_schedule and (cfg.warmup_request_count or cfg.request_rate
                               or cfg.benchmark_duration):
        raise SpecError("fixed_schedule", "takes no warmup, `request_rate` or `benchmark_duration`")
    if cfg.fixed_schedule and cfg.dataset_type == "random_pool":
        raise SpecError("fixed_schedule", "needs single_turn or multi_turn timestamps")
    from ..spec.common import check_arrivals

    check_arrivals(cfg.arrival, cfg.burstiness, cfg.request_rate, cfg.ramp_to)
    if cfg.ramp_to is not None and not (cfg.benchmark_duration or cfg.request_count
                                        or cfg.dataset_type != "random_pool"):
        raise SpecError("ramp_to", "needs `benchmark_duration` or `request_count` with a "
                        "random_pool dataset (the span of the ramp)")
    if not 0 <= cfg.shard_index < cfg.num_shards:
        raise SpecError("shard_index", f"must be below num_shards ({cfg.num_shards})")
    seconds_to_start(cfg.start_at)
    if cfg.metrics_url is not None:
        if not cfg.url:
            raise SpecError("metrics_url", "needs url (the embedded simulator's counters are "
                                           "its own)")
        if not cfg.metrics_url.startswith(("http://", "https://")):
            raise SpecError("metrics_url", "must start with http:// or https://")
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise SpecError("output_dir", f"{out} exists and is not a folder")
    from ..io.atomic import check_not_input

    check_not_input(run_outputs(out), [Path(cfg.input_file)])


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


async def _fixed(ctx: Context, turns, cfg: BenchConfig) -> None:
    try:
        await fixed_schedule(ctx, turns, cfg.request_count, cfg.concurrency)
    except UserError as exc:
        ctx.fatal = exc
        ctx.sched.stop()


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

    @contextlib.contextmanager
    def installed(self):
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        installed = []
        for sig, term in ((signal.SIGINT, False), (signal.SIGTERM, True)):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                self.loop.add_signal_handler(sig, self.on_signal, term)
                installed.append(sig)
        try:
            yield self
        finally:
            for sig in installed:
                self.loop.remove_signal_handler(sig)
                with contextlib.suppress(TypeError, ValueError):
                    signal.signal(sig, previous[sig])  # asyncio resets to the default


@dataclass
class _Session:
    """Everything one run sets up before the first request: source, schedule, client, tracker."""

    cfg: BenchConfig
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
        return iter_turns(Path(self.cfg.input_file), self.fmt)


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


def _session(cfg: BenchConfig, url: str, embedded: bool) -> _Session:
    from .sessions import SessionSource

    fmt = cfg.dataset_type if cfg.dataset_type != "auto" else detect_format(Path(cfg.input_file))
    encoder = ImageEncoder(Path(cfg.input_file).resolve().parent, max_bytes=cfg.image_cache_bytes)
    wrap = cfg.request_count is not None or cfg.benchmark_duration is not None
    shard = Shard(cfg.shard_index, cfg.num_shards)
    source = SessionSource(lambda: iter_turns(Path(cfg.input_file), fmt), fmt, wrap=wrap,
                           seed=cfg.seed, shard=(shard.index, shard.count))
    count = cfg.request_count
    if fmt == "random_pool" and count is None and cfg.benchmark_duration is None:
        count = len(source._pool or ())  # one draw per pool entry by default
    sched = Scheduler(warmup=cfg.warmup_request_count, count=count, rate=cfg.request_rate,
                      arrival=cfg.arrival, duration_s=cfg.benchmark_duration,
                      seed=shard.seed(cfg.seed), burstiness=cfg.burstiness, ramp_to=cfg.ramp_to)
    headers = dict(cfg.headers)
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    client, target = make_client(cfg.http_client, url, timeout_s=cfg.request_timeout,
                                 headers=headers, max_response_bytes=cfg.max_response_bytes)
    body_cfg = BodyConfig(model=cfg.model, endpoint_type=cfg.endpoint_type,
                          streaming=cfg.streaming, extra_inputs=cfg.extra_inputs)
    ctx = Context(client=client, path=target.path_for(ENDPOINT_PATHS[cfg.endpoint_type]),
                  body_cfg=body_cfg, encoder=encoder, source=source, sched=sched,
                  multi_turn=fmt == "multi_turn")
    tracker, note = prediction_setup(cfg, encoder, simulator_spec(cfg) if embedded else None)
    if tracker is not None:
        ctx.on_start = tracker.on_start
    return _Session(cfg, fmt, encoder, source, sched, client, ctx, count, tracker, note)


def _start(s: _Session, stop: Any, tasks: list) -> int:
    """Start the worker tasks (one per slot, or the fixed-schedule driver); the slot count."""
    cfg = s.cfg
    n_workers = cfg.concurrency or (RATE_DEFAULT_CAP if cfg.request_rate else 1)
    if stop.cancelled:
        pass  # stopped during the first scrape: no request is sent
    elif cfg.fixed_schedule:
        n_workers = cfg.concurrency or 0
        tasks.append(asyncio.ensure_future(_fixed(s.ctx, s.open_turns(), cfg)))
    else:
        tasks.extend(asyncio.ensure_future(worker(s.ctx)) for _ in range(n_workers))
    return n_workers


def _target_metrics(s: _Session) -> dict:
    """The counter names of the cache the run predicts (they pick the scraped family)."""
    if s.tracker is not None:
        return s.tracker.target.metrics
    from ..caches import get_target

    return get_target(s.cfg.cache).metrics


async def _drive(s: _Session, url: str) -> _Drive:
    """Run every request with progress, /metrics sampling and Ctrl-C / SIGTERM handling."""
    cfg = s.cfg
    tasks: list[asyncio.Future] = []
    stop = _Stopper(asyncio.get_running_loop(), s.sched, s.ctx, tasks, cfg.grace_period)
    with stop.installed():  # Ctrl-C and SIGTERM from here on: a partial export, never none
        reset = await stop.guard(_reset(cfg, url)) if cfg.reset_cache else None
        sampler = MetricsSampler(cfg.metrics_url or url, cfg.metrics_interval, quiet=cfg.quiet)
        before = await stop.guard(sampler.start())
        wall_offset = time.time_ns() - time.perf_counter_ns()
        total = None if s.count is None else s.count + cfg.warmup_request_count
        progress = Progress(s.ctx, total, enabled=not cfg.quiet and sys.stderr.isatty())
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


async def _reset(cfg: BenchConfig, url: str) -> dict:
    """--reset-cache, before warmup; says at once when the server cannot be reset."""
    from .reset import reset_server_caches

    out = await reset_server_caches(url)
    if not out["reset"] or not cfg.quiet:
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
    if s.cfg.num_shards > 1:
        info["shard"] = _shard_info(s, d)
    return info


def _shard_info(s: _Session, d: _Drive) -> dict[str, Any]:
    """What merge-runs needs of a worker: which one, the benchmark it belongs to, its clocks."""
    cfg = s.cfg
    return {"index": cfg.shard_index, "count": cfg.num_shards, "start_at": cfg.start_at,
            "settings_blake3": cfg.shard_digest,
            "dataset_blake3": file_digest(cfg.input_file), "wall_offset_ns": d.wall_offset,
            "clock": s.clock, "dispatched": s.ctx.started,
            "cache_items": CACHE_ITEMS_NAME if s.tracker is not None else None}


def _wall_span(records: list, wall_offset: int) -> tuple[int, int] | None:
    if not records:
        return None
    return (min(r.start_ns for r in records) + wall_offset,
            max((r.response_end_ns or r.start_ns) for r in records) + wall_offset)


async def _export(s: _Session, url: str, d: _Drive, embedded: bool) -> dict[str, Any]:
    """The export document of the run (records rescaled to simulated time when embedded)."""
    cfg, records = s.cfg, s.ctx.records
    prof_starts = [r.start_ns for r in records if r.phase == "profiling"]
    span = _wall_span(records, d.wall_offset)
    scale = cfg.time_scale if embedded else 1.0
    to_simulated_time(records, scale)
    timeline = None
    if s.tracker is not None:
        timeline = await fetch_timeline(url, {r.x_request_id for r in records if r.ok})
        s.tracker.timeline = timeline
    predicted = prediction_result(s.tracker, s.note, records, s.ctx.started, timeline)
    if predicted is not None and cfg.num_shards > 1 and "hits" in predicted:
        predicted["note"] = ("this worker's requests alone, from a cold cache; the server saw "
                             "every worker's: merge-runs predicts the whole benchmark")
    export = build_export(records, input_config=cfg.public(),
                          run_info=_run_info(s, url, d, embedded, scale),
                          was_cancelled=d.cancelled or s.ctx.fatal is not None,
                          wall_offset_ns=d.wall_offset, predicted=predicted,
                          scraped=counter_delta(d.before, d.after, _target_metrics(s)),
                          wall_span_ns=span)
    export["server_metrics_timeseries"] = d.sampler.series(
        min(prof_starts) if prof_starts else None, scale)
    if cfg.goodput:
        from .goodput import export_goodput

        export.update(export_goodput(records, export, cfg.goodput))
    from ..report.aggregate import run_aggregates

    export.update(run_aggregates(records))
    return export


async def _run_async(cfg: BenchConfig, url: str, embedded: bool = False) -> BenchResult:
    s = _session(cfg, url, embedded)
    if cfg.num_shards > 1:
        s.clock = await probe_clock(url)
    if cfg.start_at is not None:
        await asyncio.sleep(seconds_to_start(cfg.start_at))
    d = await _drive(s, url)
    export = await _export(s, url, d, embedded)
    extra: dict[str, Iterable[bytes]] | None = None
    if cfg.num_shards > 1 and s.tracker is not None:
        extra = {CACHE_ITEMS_NAME: cache_item_lines(s.tracker, s.ctx.records)}
    paths = write_exports(Path(cfg.output_dir), s.ctx.records, export, extra)
    if s.ctx.fatal is not None:
        raise UserError(f"{s.ctx.fatal} (run stopped; partial exports in {cfg.output_dir})")
    return BenchResult(export, s.ctx.records, paths, console_table(export), d.stopped_by)


def _run_loop(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def check_config(cfg: BenchConfig) -> None:
    """Every check ``run_bench`` makes before it starts anything (``ab`` checks both runs first)."""
    validate_config(cfg)
    if not cfg.url:
        from ..sim.profile import load_profile

        load_profile(cfg.profile)
        simulator_spec(cfg)  # checks every setting, the cache size too (spec.cache.SimCache)


DTYPE_NAMES = {1: "fp8", 2: "bfloat16", 4: "float32"}  # Geometry.values()'s dtype_bytes back


def simulator_spec(cfg: BenchConfig):  # -> spec.sim.Simulator
    """The embedded simulator's settings: the run's profile, cache target and capacity, model
    geometry and time scale, then ``--sim-arg`` (parsed and checked here, before any server
    starts: a bad one is one error line)."""
    from ..spec.sim import Simulator, parse_sim_args

    values: dict[str, Any] = {"profile": cfg.profile, "cache_size": cfg.cache_gb,
                              "time_scale": cfg.time_scale, "model_path": cfg.model_path}
    if cfg.cache_explicit:
        values["cache"] = cfg.cache
    if cfg.encoder_budget is not None:
        values["encoder_budget"] = cfg.encoder_budget
    for key, size in (cfg.geometry or {}).items():
        if key == "dtype_bytes":
            values["dtype"] = DTYPE_NAMES[size]
        else:
            values[key] = size
    return parse_sim_args(cfg.sim_args, Simulator().with_values(values))


def run_bench(cfg: BenchConfig) -> BenchResult:
    """Run one benchmark (starting the embedded simulator when ``cfg.url`` is None); a
    sharded worker runs its share (``loadgen/shard.py``)."""
    from ..io.atomic import output_lock, reading

    validate_config(cfg)
    if cfg.num_shards > 1:
        cfg = shard_config(replace(cfg, shard_digest=settings_digest(cfg.public())),
                           Shard(cfg.shard_index, cfg.num_shards))
    with reading([cfg.input_file]), output_lock(cfg.output_dir):  # one writer per folder
        return _run_with_target(cfg)


def _run_with_target(cfg: BenchConfig) -> BenchResult:
    if cfg.url:
        return _run_loop(_run_async(cfg, cfg.url))
    from ..sim.embedded import EmbeddedServer

    server = EmbeddedServer(spec=simulator_spec(cfg))
    try:
        server.start()
    except KeyboardInterrupt:  # stopped while the simulator starts: an empty, cancelled export
        _write_unstarted(cfg)
        raise
    with server as srv:
        return _run_loop(_run_async(cfg, srv.url, embedded=True))


def _write_unstarted(cfg: BenchConfig) -> None:
    """The export of a run stopped before its first request (was_cancelled, no records)."""
    export = build_export([], input_config=cfg.public(), run_info={"requests_started": 0},
                          was_cancelled=True)
    write_exports(Path(cfg.output_dir), [], export)
