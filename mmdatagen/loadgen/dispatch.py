"""Dispatch in real time: the loader's workers drive the dispatch core.

Which request starts when (concurrency counting sessions, causal sessions, warmup then profiling,
the request rate, count, duration) is ``mmdatagen.scheduling``'s, the rule ``simulate`` and the
analysis drive with their own clocks. Here each worker is one slot of the core, and the
:class:`Scheduler` waits in asyncio for what the core asks: a paced ticket's time, the warmup
barrier, or SIGINT. ``fixed_schedule`` (rows sent at their timestamps) is outside the core.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..arrivals import make_pacer
from ..errors import SpecError, UserError
from ..io.imageref import local_files
from ..io.readers import Turn
from ..metrics import RequestRecord
from ..scheduling import DONE, HOLD, PROFILING, SEND, Core, Feed, Slot, phases
from ..sessions import row_label
from .client import Result
from .failures import ErrorKind, error
from .payload import BodyConfig, ImageEncoder, resolved_body, serialize
from .sessions import Session, SessionSource


class Scheduler:
    """The dispatch core (``mmdatagen.scheduling``) in real time: asyncio waits for paced
    tickets, the warmup barrier and stop; ``time.monotonic()`` is the clock it reads."""

    def __init__(self, *, warmup: int, count: int | None, rate: float | None = None,
                 arrival: str = "poisson", duration_s: float | None = None, seed: int = 0,
                 burstiness: float = 1.0, ramp_to: float | None = None) -> None:
        pacer = make_pacer(rate, arrival, seed, burstiness=burstiness, ramp_to=ramp_to,
                           duration_s=duration_s, count=count)
        self.phases = phases(warmup, count, pacer, duration_s)
        self.core: Core[Session, Turn] | None = None
        self.stop_event = asyncio.Event()
        self._opened = asyncio.Event()  # set when a phase opens (a fresh one per phase)

    def attach(self, source: Feed[Session, Turn]) -> None:
        """The sessions to dispatch (the loader's ``SessionSource``)."""
        self.core = Core(source, self.phases)

    @property
    def stopped(self) -> bool:
        return self.stop_event.is_set()

    def stop(self) -> None:
        """Stop issuing (SIGINT, duration reached, a bad dataset row); waiters return False."""
        if self.core is not None:
            self.core.stop()
        self.stop_event.set()
        self._opened.set()

    def slot(self) -> Slot[Session, Turn]:
        assert self.core is not None, "Context attaches the source"
        return self.core.add_slot()

    def _wake(self, core: Core[Session, Turn]) -> None:
        if core.released:  # a phase opened: the held slots ask again
            core.released.clear()
            self._opened.set()
            self._opened = asyncio.Event()
        if core.stopped and not self.stop_event.is_set():  # the duration is reached
            self.stop()

    async def next(self, slot: Slot[Session, Turn]) -> bool:
        """Wait until ``slot`` may send (True: its ``session``, ``turn`` and ``phase`` are set)
        or must stop (False)."""
        core = self.core
        assert core is not None, "Context attaches the source"
        while True:
            step = core.next(slot, time.monotonic())
            if core.released or core.stopped:
                self._wake(core)
            if step == SEND:
                return True
            if step == DONE:
                return False
            if step == HOLD:
                await self._opened.wait()
            elif (wait := slot.at - time.monotonic()) > 0:  # a paced ticket
                try:
                    await asyncio.wait_for(self.stop_event.wait(), wait)
                    return False
                except TimeoutError:
                    pass

    def complete(self, slot: Slot[Session, Turn]) -> Turn | None:
        """``slot``'s request is over; its session's next turn (None: the session is over)."""
        assert self.core is not None, "Context attaches the source"
        core = self.core
        turn = core.complete(slot, time.monotonic())
        if core.released or core.stopped:
            self._wake(core)
        return turn


@dataclass
class Context:
    """Everything workers share."""

    client: Any  # RawClient | AioClient (loadgen/client.py)
    path: str
    body_cfg: BodyConfig
    encoder: ImageEncoder
    source: SessionSource
    sched: Scheduler
    multi_turn: bool = False
    records: list[RequestRecord] = field(default_factory=list)
    on_start: Callable[[Turn, list[dict] | None], None] | None = None
    in_flight: int = 0
    started: int = 0
    errors: int = 0
    done: int = 0
    fatal: UserError | None = None

    def __post_init__(self) -> None:
        self.sched.attach(self.source)


def output_tokens(res: Result, streaming: bool) -> int:
    """Server usage when present; else content chunks (streaming) or words (non-streaming)."""
    usage = res.usage
    if usage and isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"]
    if streaming:
        return res.chunks
    return len(res.text.split()) if res.text else (1 if res.first_ns is not None else 0)


def _session_headers(sess: Session, xid: str) -> str:
    return (f"X-Request-ID: {xid}\r\nX-Correlation-ID: {sess.correlation_id}\r\n"
            f"X-Session-Affinity: {sess.correlation_id}\r\n")


async def _one(ctx: Context, sess: Session, turn: Turn, phase: str,
               history: list[dict] | None) -> None:
    cfg = ctx.body_cfg
    xid = str(uuid.uuid4())
    try:
        files = local_files(turn, ctx.encoder.dataset_dir)  # every reference resolved once
        if ctx.encoder.needs_encoding(files):
            body = await asyncio.to_thread(resolved_body, turn, files, cfg, ctx.encoder, history)
        else:
            body = resolved_body(turn, files, cfg, ctx.encoder, history)
        payload = serialize(body)
    except Exception as exc:  # a bad row must not kill the run
        now = time.perf_counter_ns()
        res = Result(start_ns=now, end_ns=now,
                     error=error(ErrorKind.INVALID_REQUEST, f"{exc.__class__.__name__}: {exc}"[:300]))
        payload = None
    dispatch_index = None
    if payload is not None:
        dispatch_index = ctx.started
        ctx.started += 1
        if ctx.on_start is not None:
            ctx.on_start(turn, history)
        ctx.in_flight += 1
        started = time.perf_counter_ns()
        try:
            res = await ctx.client.request(ctx.path, payload, _session_headers(sess, xid),
                                           streaming=cfg.streaming,
                                           collect_text=history is not None)
        except asyncio.CancelledError:
            res = Result(start_ns=started, end_ns=time.perf_counter_ns(),
                         error=error(ErrorKind.CANCELLED, "request cancelled at shutdown"))
            ctx.in_flight -= 1
            _record(ctx, sess, turn, phase, xid, res, dispatch_index)
            raise
        except Exception as exc:  # never crash the run on a client bug
            res = Result(start_ns=started, end_ns=time.perf_counter_ns(),
                         error=error(ErrorKind.CLIENT, f"{exc.__class__.__name__}: {exc}"[:300]))
        ctx.in_flight -= 1
    _record(ctx, sess, turn, phase, xid, res, dispatch_index)
    if history is not None and payload is not None and "messages" in body:
        history.append(body["messages"][-1])
        history.append({"role": "assistant", "content": res.text or ""})


def _record(ctx: Context, sess: Session, turn: Turn, phase: str, xid: str, res: Result,
            dispatch_index: int | None) -> None:
    streaming = ctx.body_cfg.streaming
    ok = res.error is None
    usage = res.usage or {}
    prompt = usage.get("prompt_tokens")
    n_img = len(turn.images) or len(turn.image_uuids or ())
    ctx.records.append(RequestRecord(
        conversation_id=sess.conversation_id, turn_index=sess.sent - 1, phase=phase,
        start_ns=res.start_ns, first_token_ns=res.first_ns if ok else None,
        end_ns=(res.last_ns if streaming else res.end_ns) if ok else None,
        output_tokens=output_tokens(res, streaming) if ok else 0,
        input_tokens=prompt if isinstance(prompt, int) else None, num_images=n_img,
        error=res.error, image_hits=res.image_hits, image_misses=res.image_misses,
        server_ttft_ns=res.server_ttft_ns, x_request_id=xid, streaming=streaming,
        response_end_ns=res.end_ns, http_status=res.status, dispatch_index=dispatch_index))
    ctx.done += 1
    if not ok:
        ctx.errors += 1


def _fatal(ctx: Context, exc: UserError) -> None:
    """A bad dataset row stops the whole run; the first such error is the run's."""
    if ctx.fatal is None:
        ctx.fatal = exc
    ctx.sched.stop()


async def worker(ctx: Context) -> None:
    """Run sessions until no ticket or no data is left; a bad dataset row stops the whole run."""
    try:
        await _worker(ctx)
    except UserError as exc:
        _fatal(ctx, exc)


async def _worker(ctx: Context) -> None:
    sched = ctx.sched
    slot = sched.slot()
    history: list[dict] | None = None
    while await sched.next(slot):
        assert slot.session is not None and slot.turn is not None  # what the core sends
        if slot.opens:
            history = [] if ctx.multi_turn else None
        await _one(ctx, slot.session, slot.turn, slot.phase, history)
        turn = sched.complete(slot)
        if turn is not None and turn.delay_ms:
            await asyncio.sleep(float(turn.delay_ms) / 1000.0)


async def fixed_schedule(ctx: Context, turns, limit: int | None, cap: int | None) -> None:
    """Send each row at its ``timestamp`` (ms, relative to the first row's), lazily read.

    No warmup; ``cap`` optionally bounds requests in flight (late rows then start late). A bad
    row stops the run, as in :func:`worker`.
    """
    try:
        await _fixed_schedule(ctx, turns, limit, cap)
    except UserError as exc:
        _fatal(ctx, exc)


async def _fixed_schedule(ctx: Context, turns, limit: int | None, cap: int | None) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first: float | None = None
    sem = asyncio.Semaphore(cap) if cap else None
    corr: dict[str, str] = {}
    turns_of: dict[str, int] = {}
    running: set[asyncio.Task] = set()

    async def send(sess: Session, turn: Turn) -> None:
        try:
            await _one(ctx, sess, turn, PROFILING, None)
        finally:
            if sem is not None:
                sem.release()

    n = 0
    try:
        for turn in turns:
            if ctx.sched.stopped or (limit is not None and n >= limit):
                break
            if turn.timestamp_ms is None:
                raise SpecError("fixed_schedule", f"needs a 'timestamp' on every row (line "
                                f"{turn.line_no} has none)")
            ts = float(turn.timestamp_ms)
            first = ts if first is None else first
            delay = t0 + (ts - first) / 1000.0 - loop.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(ctx.sched.stop_event.wait(), delay)
                    break
                except TimeoutError:
                    pass
            if sem is not None:
                await sem.acquire()
            sid = row_label(turn.session_id, turn.line_no)
            if sid not in corr:
                corr[sid] = str(uuid.uuid4())
            turns_of[sid] = turns_of.get(sid, 0) + 1
            sess = Session(sid, corr[sid], complete=True, sent=turns_of[sid])
            task = asyncio.ensure_future(send(sess, turn))
            running.add(task)
            task.add_done_callback(running.discard)
            n += 1
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    except asyncio.CancelledError:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise
