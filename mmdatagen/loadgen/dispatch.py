"""Dispatch: which request starts when (concurrency, request rate, causal sessions, phases).

Workers each own one session at a time, so ``--concurrency N`` counts sessions in flight
(AIPerf's causal replay). Every request first takes a ticket from the :class:`Scheduler`, which
hands out warmup tickets, then (after every warmup request has completed) profiling tickets,
paced by the request rate when one is set and stopped by the request count, the duration or
SIGINT.
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
from ..io.readers import Turn
from ..metrics import RequestRecord
from ..sessions import row_label
from .client import Result
from .failures import ErrorKind, error
from .payload import BodyConfig, ImageEncoder, build_body, serialize
from .sessions import Session, SessionSource

WARMUP, PROFILING = "warmup", "profiling"


class Scheduler:
    """Tickets: phase per request, the warmup barrier, rate pacing, count/duration/stop limits."""

    def __init__(self, *, warmup: int, count: int | None, rate: float | None = None,
                 arrival: str = "poisson", duration_s: float | None = None, seed: int = 0,
                 burstiness: float = 1.0, ramp_to: float | None = None) -> None:
        self.warmup = warmup
        self.count = count
        self.rate = rate
        self.arrival = arrival
        self.duration_s = duration_s
        self.pacer = make_pacer(rate, arrival, seed, burstiness=burstiness, ramp_to=ramp_to,
                                duration_s=duration_s, count=count)
        self.issued = 0
        self.warm_issued = 0
        self.warm_done = 0
        self.stopped = False
        self.gate = asyncio.Event()
        self.stop_event = asyncio.Event()
        self.profile_start: float | None = None
        if warmup == 0:
            self._open_gate()

    def _open_gate(self) -> None:
        if not self.gate.is_set():
            self.profile_start = time.monotonic()
            self.gate.set()

    def stop(self) -> None:
        """Stop issuing (SIGINT, duration reached); waiters return None."""
        self.stopped = True
        self.stop_event.set()
        self.gate.set()

    async def ticket(self) -> str | None:
        """The phase of the next request, or None when no more requests may start."""
        if self.stopped:
            return None
        idx = self.issued
        if idx < self.warmup:
            self.issued += 1
            self.warm_issued += 1
            return WARMUP
        if self.count is not None and idx >= self.warmup + self.count:
            return None
        self.issued += 1
        if not self.gate.is_set():
            await self.gate.wait()
        if self.stopped:
            return None
        now = time.monotonic()
        if self.pacer is not None:
            slot = self.pacer.take(now)
            if slot > now:
                try:
                    await asyncio.wait_for(self.stop_event.wait(), slot - now)
                    return None
                except TimeoutError:
                    pass
                now = time.monotonic()
        start = self.profile_start if self.profile_start is not None else now
        if self.duration_s is not None and now - start >= self.duration_s:
            self.stop()
            return None
        return PROFILING

    def finished(self, phase: str) -> None:
        """A request (or an unused ticket) of ``phase`` is over."""
        if phase == WARMUP:
            self.warm_done += 1
            if self.warm_done >= self.warmup:
                self._open_gate()

    def source_exhausted(self) -> None:
        """No more data: let profiling waiters go once issued warmup requests are done."""
        if self.warm_done >= self.warm_issued:
            self._open_gate()


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
        if ctx.encoder.needs_encoding(turn):
            body = await asyncio.to_thread(build_body, turn, cfg, ctx.encoder, history)
        else:
            body = build_body(turn, cfg, ctx.encoder, history)
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
    ctx.sched.finished(phase)


async def worker(ctx: Context) -> None:
    """Run sessions until no ticket or no data is left; a bad dataset row stops the whole run."""
    try:
        await _worker(ctx)
    except UserError as exc:
        if ctx.fatal is None:
            ctx.fatal = exc
        ctx.sched.stop()


async def _worker(ctx: Context) -> None:
    sched, source = ctx.sched, ctx.source
    while True:
        phase = await sched.ticket()
        if phase is None:
            return
        sess = source.next_session()
        turn = source.next_turn(sess) if sess is not None else None
        if turn is None:
            sched.finished(phase)
            sched.source_exhausted()
            return
        history: list[dict] | None = [] if ctx.multi_turn else None
        assert sess is not None  # a turn came from it
        while True:
            await _one(ctx, sess, turn, phase, history)
            turn = source.next_turn(sess)
            if turn is None:
                break
            if turn.delay_ms:
                await asyncio.sleep(float(turn.delay_ms) / 1000.0)
            phase = await sched.ticket()
            if phase is None:
                return


async def fixed_schedule(ctx: Context, turns, limit: int | None, cap: int | None) -> None:
    """Send each row at its ``timestamp`` (ms, relative to the first row's), lazily read.

    No warmup; ``cap`` optionally bounds requests in flight (late rows then start late).
    """
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
