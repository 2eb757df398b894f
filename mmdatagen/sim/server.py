"""The real-time simulator: an aiohttp OpenAI-compatible server driving the engine model.

One asyncio task runs engine steps, sleeping each step's modelled duration x ``time_scale``
against absolute deadlines (timer overshoot does not accumulate); handlers wait for their
request's tokens and stream them. Headers with the request's cache hits/misses and the
server-side TTFT are sent with the first token.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict

from aiohttp import web

from ..caches import RESET_PATHS, TIMELINE_PATH, TieredCache
from ..vlm import VisionModel, resolve_model
from .engine import Engine, SimRequest
from .errors import RequestError, error_body
from .faults import FaultConfig, FaultInjector, RequestFaults
from .profile import Profile
from .protocol import (
    DONE,
    NOTICE,
    ImageResolver,
    ParsedRequest,
    Responder,
    parse_body,
)

MAX_LAG_S = 0.05  # behind schedule by more than this: restart the step clock instead of catching up
JSON = "application/json"
TIMELINE_MAX = 1 << 20  # requests whose cache events are kept for the loader's replay


class RealtimeDriver:
    """Runs engine steps in wall time; simulated ms = wall ms / time_scale."""

    def __init__(self, engine: Engine, time_scale: float = 1.0) -> None:
        self.engine, self.scale = engine, time_scale
        self.t0 = time.perf_counter()
        self._wake = asyncio.Event()
        self.lag_resets = 0
        self.lag_s = 0.0
        self.late_s = 0.0        # sum over steps of (token emission - scheduled step end)
        self.configured_s = 0.0  # sum of the steps' modelled durations x time_scale

    def now_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0 / self.scale

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        eng, scale = self.engine, self.scale
        next_start: float | None = None
        while True:
            if eng.idle:
                self._wake.clear()
                await self._wake.wait()
                next_start = None
                continue
            now = time.perf_counter()
            if next_start is None or now - next_start > MAX_LAG_S:
                if next_start is not None:
                    self.lag_resets += 1
                    self.lag_s += now - next_start
                next_start = now
            sim_now = (next_start - self.t0) * 1000.0 / scale
            dur = eng.begin_step(sim_now)
            if dur is None:  # runnable work is blocked on the serial encoder (or nothing to do)
                eng.end_step(sim_now)
                wake = eng.next_wake(sim_now)
                self._wake.clear()
                timeout = None if wake is None else max(0.0, self.t0 + wake * scale / 1000.0
                                                        - time.perf_counter())
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except TimeoutError:
                    pass
                next_start = None
                continue
            deadline = next_start + dur * scale / 1000.0
            delay = deadline - time.perf_counter()
            await asyncio.sleep(max(0, delay))
            self.late_s += max(0.0, time.perf_counter() - deadline)
            self.configured_s += dur * scale / 1000.0
            eng.end_step((deadline - self.t0) * 1000.0 / scale)
            next_start = deadline


class _Waiter:
    """Wakes a handler when its request gets tokens (every token when streaming)."""

    __slots__ = ("event", "first_ns", "streaming")

    def __init__(self, streaming: bool) -> None:
        self.event = asyncio.Event()
        self.first_ns = 0
        self.streaming = streaming

    def __call__(self, r: SimRequest) -> None:
        if r.emitted == 1:
            self.first_ns = time.perf_counter_ns()
            self.event.set()
        elif self.streaming or r.done:
            self.event.set()


async def _stamp_clock(request: web.Request, response: web.StreamResponse) -> None:
    """Every response tells the server's wall clock in ns: sharded load workers measure their
    offset against it (``loadgen/shard.py``), finer than HTTP's Date."""
    response.headers["x-mmdatagen-server-time-ns"] = str(time.time_ns())


class SimServer:
    """State and handlers of one simulator instance."""

    def __init__(self, profile: Profile, cache_size: float | None, time_scale: float = 1.0,
                 faults: FaultConfig | None = None, api_key: str | None = None,
                 served_names: tuple[str, ...] = (), model: VisionModel | None = None) -> None:
        """``cache_size``: the capacity of the profile's cache target, in that target's unit
        (None: the target's default)."""
        self.p = profile
        self.model = model or resolve_model(profile.model)
        self.engine = Engine(profile, cache_size, self.model)
        self.cache_size = self.engine.cache_size
        # per X-Request-ID: [lookup event, finish event] of the cache timeline (bounded)
        self.timeline: OrderedDict[str, list[int | None]] = OrderedDict()
        self.driver = RealtimeDriver(self.engine, time_scale)
        self.scale = time_scale
        self.resolver = ImageResolver(self.model, profile)
        self.faults = FaultInjector(faults or FaultConfig())
        self.api_key = api_key
        self.names = served_names or (profile.served_model_name,)
        self.models = frozenset(self.names) | {self.model.name}
        self.max_body = int(profile.max_body_mb * (1 << 20))
        self._ids = itertools.count()
        self._rids = itertools.count()  # one per request: the cache model tracks users by it
        self.c = dict.fromkeys(("requests", "errors", "ok", "prompt_tokens", "gen_tokens",
                                "aborted", "faults_error", "faults_disconnect",
                                "faults_stall", "faults_malformed", "in_flight"), 0)
        self._task: asyncio.Task | None = None

    # -- app ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body + 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get(TIMELINE_PATH, self.cache_timeline)
        for path in RESET_PATHS:
            app.router.add_post(path, self.reset_cache)
        app.on_response_prepare.append(_stamp_clock)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        if not self.p.zero_delay:
            self._task = asyncio.get_running_loop().create_task(self.driver.run())

    async def _stop(self, app: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def timing_report(self) -> str:
        """One line: how closely real token times followed the model (measured vs configured).

        Steps are chained on absolute deadlines, so a late wake-up delays that step's tokens
        but not the following steps; only clock resets (behind by more than MAX_LAG_S) stretch
        the run. Measured ITL / configured ITL = (configured + lost) / configured.
        """
        d = self.driver
        if not d.configured_s:
            return "engine: no steps run"
        steps = max(1, self.engine.steps)
        stretch = d.lag_s / d.configured_s * 100
        return (f"engine: {self.engine.steps} steps over {d.configured_s:.2f} s configured; "
                f"tokens emitted {d.late_s / steps * 1000:.2f} ms after schedule on average "
                f"(not cumulative); {d.lag_resets} clock resets lost {d.lag_s * 1000:.0f} ms, "
                f"measured ITL vs configured {stretch:+.1f} %"
                + ("; raise --time-scale" if stretch > 2.0 else ""))

    # -- simple endpoints -----------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "note": NOTICE})

    async def list_models(self, request: web.Request) -> web.Response:
        if (err := self._auth(request)) is not None:
            return err
        created = int(time.time())
        data = [{"id": n, "object": "model", "created": created, "owned_by": "mmdatagen-simulator",
                 "root": self.model.name, "max_model_len": self.p.max_model_len,
                 "description": f"{NOTICE} (profile {self.p.name})"} for n in self.names]
        return web.json_response({"object": "list", "data": data})

    async def cache_timeline(self, request: web.Request) -> web.Response:
        """The order of cache events per request (X-Request-ID): the loader replays it to
        predict this server's cache exactly."""
        t = self.engine.target
        return web.json_response({"target": t.name, "key": t.key, "present": t.present,
                                  "events": self.timeline})

    async def reset_cache(self, request: web.Request) -> web.Response:
        """vLLM's dev-mode resets, as vLLM scopes them (the processor cache; the encoder cache,
        also in front of Dynamo's tier; the prefix cache, which the simulator does not model),
        and ``/mmdatagen/reset_cache``, every tier."""
        cache, target = self.engine.cache, self.engine.target
        what = request.path.rsplit("/", 1)[-1]
        if what == "reset_cache":
            cache.clear()
        elif what == "reset_encoder_cache" and isinstance(cache, TieredCache):
            cache.clear_front()
        elif (what == "reset_encoder_cache" and target.entry == "tokens") or (
                what == "reset_mm_cache" and target.entry == "processor"):
            cache.clear()
        if what == "reset_prefix_cache":
            return web.json_response({"success": True})
        return web.Response(status=200)

    def _record_timeline(self, xid: str | None, sreq: SimRequest) -> None:
        if xid is None or sreq.lookup_seq is None:
            return
        if len(self.timeline) >= TIMELINE_MAX:
            self.timeline.popitem(last=False)
        self.timeline[xid] = [sreq.lookup_seq, sreq.finish_seq]

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.prometheus(), content_type="text/plain")

    def prometheus(self) -> str:
        cc, c, e = self.engine.cache.counters(), self.c, self.engine
        rows = [
            ("embedding_cache_queries_total", "counter", cc["queries"]),
            ("embedding_cache_hits_total", "counter", cc["hits"]),
            ("embedding_cache_misses_total", "counter", cc["misses"]),
            ("embedding_cache_evictions_total", "counter", cc["evictions"]),
            ("embedding_cache_bytes", "gauge", cc["bytes"]),
            ("embedding_cache_entries", "gauge", cc["entries"]),
            ("embedding_cache_capacity_bytes", "gauge", e.cache.capacity),
            ("requests_total", "counter", c["requests"]),
            ("requests_success_total", "counter", c["ok"]),
            ("request_errors_total", "counter", c["errors"]),
            ("requests_aborted_total", "counter", c["aborted"]),
            ("requests_in_flight", "gauge", c["in_flight"]),
            ("requests_running", "gauge", len(e.running)),
            ("requests_waiting", "gauge", len(e.waiting)),
            ("prompt_tokens_total", "counter", c["prompt_tokens"]),
            ("generation_tokens_total", "counter", c["gen_tokens"]),
            ("encoder_images_total", "counter", e.encoded_images),
            ("engine_steps_total", "counter", e.steps),
            ("engine_busy_seconds_total", "counter", e.busy_ms / 1000.0),
            ("engine_lag_resets_total", "counter", self.driver.lag_resets),
            ("engine_lag_seconds_total", "counter", self.driver.lag_s),
            ("engine_step_configured_seconds_total", "counter", self.driver.configured_s),
            ("engine_emission_late_seconds_total", "counter", self.driver.late_s),
            ("faults_injected_total", "counter", None),
            # where completed requests' time went (simulated seconds), named as vLLM's histograms
            ("time_to_first_token_seconds_sum", "counter",
             sum(e.stage_ms[k] for k in ("frontend", "queue", "prefill")) / 1000.0),
            ("request_queue_time_seconds_sum", "counter", e.stage_ms["queue"] / 1000.0),
            ("request_prefill_time_seconds_sum", "counter", e.stage_ms["prefill"] / 1000.0),
            ("request_decode_time_seconds_sum", "counter", e.stage_ms["decode"] / 1000.0),
            ("request_stages_count", "counter", e.staged),
        ]
        out = []
        for name, kind, value in rows:
            full = "mmdatagen_sim_" + name
            out.append(f"# TYPE {full} {kind}")
            if value is None:
                for k in ("error", "disconnect", "stall", "malformed"):
                    out.append(f'{full}{{kind="{k}"}} {c["faults_" + k]}')
            else:
                out.append(f"{full} {value}")
        t = e.target
        out.append(f'mmdatagen_sim_info{{profile="{self.p.name}",model="{self.model.name}",'
                   f'cache="{t.name}",key_mode="{t.key}",register="{t.present}",'
                   f'time_scale="{self.scale}"}} 1')
        if "encoder_hits" in cc:  # a two-tier target: the front (vLLM's encoder cache) beside
            out.append("# TYPE mmdatagen_sim_encoder_cache_hits_total counter")
            out.append(f"mmdatagen_sim_encoder_cache_hits_total {cc['encoder_hits']}")
        for what, name in t.metrics.items():  # the engine's own counter names (vLLM's, Dynamo's)
            out.append(f"# TYPE {name.removesuffix('_total')} counter")
            out.append(f'{name}{{model_name="{self.names[0]}"}} {cc[what]}')
        return "\n".join(out) + "\n"

    # -- completions ----------------------------------------------------------------------
    def _auth(self, request: web.Request) -> web.Response | None:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._error(401, "invalid or missing API key", "authentication_error")
        return None

    def _error(self, status: int, message: str, etype: str = "invalid_request_error",
               code: str | None = None) -> web.Response:
        self.c["errors"] += 1
        return web.Response(status=status, body=error_body(status, message, etype, code),
                            content_type=JSON)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completions")

    async def _complete(self, request: web.Request, kind: str) -> web.StreamResponse:
        t_arr = time.perf_counter_ns()
        self.c["requests"] += 1
        parsed = await self._read_request(request, kind)
        if isinstance(parsed, web.Response):
            return parsed
        faults = self.faults.draw(parsed.target_tokens)
        if faults.error:
            self.c["faults_error"] += 1
            return self._error(self.faults.cfg.error_status, "injected fault", "server_error",
                               "injected_fault")
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        responder = Responder(parsed, f"{prefix}sim-{next(self._ids)}")
        waiter = _Waiter(parsed.stream)
        sreq = SimRequest(next(self._rids), parsed.text_tokens, parsed.images, parsed.target_tokens,
                          notify=waiter)
        self.c["in_flight"] += 1
        try:
            await self._first_token(sreq, waiter, faults)
            headers = {"x-mmdatagen-image-hits": str(sreq.hits),
                       "x-mmdatagen-image-misses": str(sreq.misses),
                       "x-mmdatagen-server-ttft-ns": str(waiter.first_ns - t_arr)}
            if (xid := request.headers.get("X-Request-ID")) is not None:
                headers["x-request-id"] = xid
            if parsed.stream:
                return await self._stream(request, sreq, waiter, responder, headers, faults)
            while not sreq.done:
                waiter.event.clear()
                await waiter.event.wait()
            self._count_ok(parsed, sreq.emitted)
            return web.Response(body=responder.full(sreq.emitted), headers=headers,
                                content_type=JSON)
        finally:
            self.c["in_flight"] -= 1
            self._record_timeline(request.headers.get("X-Request-ID"), sreq)
            if not sreq.done:
                self.c["aborted"] += 1
                self.engine.abort(sreq)

    async def _read_request(self, request: web.Request, kind: str) -> ParsedRequest | web.Response:
        """The checked request (auth, size, body), or the error response to send instead."""
        if (err := self._auth(request)) is not None:
            return err
        too_large = f"request body exceeds {self.p.max_body_mb:g} MB"
        if request.content_length is not None and request.content_length > self.max_body:
            return self._error(413, too_large, code="request_too_large")
        try:
            raw = await request.read()
            if len(raw) > self.max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=self.max_body, actual_size=len(raw))
            return parse_body(raw, kind, self.p, self.resolver, self.models)
        except web.HTTPRequestEntityTooLarge:
            return self._error(413, too_large, code="request_too_large")
        except RequestError as exc:
            return self._error(exc.status, exc.message, exc.etype, exc.code)
        except Exception as exc:
            return self._error(400, f"cannot process request: {type(exc).__name__}")

    async def _first_token(self, sreq: SimRequest, waiter: _Waiter, faults: RequestFaults
                           ) -> None:
        """Through the frontend into the engine, until the first token (plus an injected
        stall before it)."""
        if self.p.zero_delay:
            self.engine.instant(sreq, 0.0)
            waiter.first_ns = time.perf_counter_ns()
        else:
            now = self.driver.now_ms()
            sreq.arrival = now
            ready = self.engine.frontend_ready_at(sreq, now)
            if ready > now:
                await asyncio.sleep((ready - now) * self.scale / 1000.0)
            self.engine.add(sreq)
            self.driver.wake()
            await waiter.event.wait()
        if faults.stall_first_s:
            self.c["faults_stall"] += 1
            await asyncio.sleep(faults.stall_first_s)
            waiter.first_ns = time.perf_counter_ns()

    def _count_ok(self, parsed, emitted: int) -> None:
        self.c["ok"] += 1
        self.c["prompt_tokens"] += parsed.prompt_tokens
        self.c["gen_tokens"] += emitted

    async def _stream(self, request: web.Request, sreq: SimRequest, waiter: _Waiter,
                      responder: Responder, headers: dict, faults: RequestFaults) -> web.StreamResponse:
        headers["Cache-Control"] = "no-cache"
        resp = web.StreamResponse(headers=headers)
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        target = sreq.target_tokens
        special = {faults.disconnect_at, faults.stall_at, faults.malformed_at} - {None}
        sent = 0
        while True:
            waiter.event.clear()
            n = sreq.emitted
            buf = bytearray()
            while sent < n:
                if sent in special:
                    if buf:
                        await resp.write(bytes(buf))
                        buf.clear()
                    if sent == faults.disconnect_at:
                        self.c["faults_disconnect"] += 1
                        request.transport.abort() if request.transport else None
                        return resp
                    if sent == faults.malformed_at:
                        self.c["faults_malformed"] += 1
                        buf += b'data: {"id": "broken", "choices": [\n\n'
                    if sent == faults.stall_at:
                        self.c["faults_stall"] += 1
                        await asyncio.sleep(self.faults.cfg.stall_ms / 1000.0)
                    special.discard(sent)
                buf += responder.chunk(sent, sent == target - 1)
                sent += 1
            if sent >= target:
                if responder.req.include_usage:
                    buf += responder.usage_chunk(sent)
                buf += DONE
                await resp.write(bytes(buf))
                break
            if buf:
                await resp.write(bytes(buf))
            if sreq.done:  # aborted underneath us
                return resp
            await waiter.event.wait()
        self._count_ok(responder.req, sent)
        await resp.write_eof()
        return resp
