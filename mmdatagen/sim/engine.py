"""The engine model: continuous batching in discrete steps, shared by virtual and real time.

Each step: decode one token for every running request past prefill, continue chunked prefills,
admit waiting requests while slots (``max_running``) and the step's token budget allow, run the
vision encoder for admitted images that miss the embedding cache. The step's duration is a
linear function of that work (see :class:`~mmdatagen.sim.profile.Profile`); tokens are emitted
at the step's end. The engine never sleeps: a driver (virtual clock or asyncio) calls
:meth:`Engine.begin_step` / :meth:`Engine.end_step` and advances time by the returned duration.
This is a performance model, not a language model: it produces token counts and times only.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..caches import CacheModel, CacheTarget
from ..caches.entries import front_budget, image_flags, make_target_cache, request_items
from ..metrics import STAGES, stage_block
from ..vlm import VisionModel
from .profile import Profile

GIB = 1 << 30


@dataclass(frozen=True)
class SimImage:
    """One image as the engine sees it: cache key (``io.imageref.Identity.key``), embedding
    tokens, accounted cache bytes and the pixels the frontend decodes (0: nothing to decode)."""

    key: Hashable
    tokens: int
    prompt_tokens: int
    nbytes: int
    is_url: bool = False
    pixels: int = 0


class SimRequest:
    """A request inside the engine; times are in the driver's clock (ms)."""

    __slots__ = (
        "admit_t",
        "arrival",
        "done",
        "emitted",
        "enc_ready",
        "end_t",
        "first_token_t",
        "hits",
        "finish_seq",
        "images",
        "lookup_seq",
        "misses",
        "notify",
        "prefilled",
        "prompt_tokens",
        "queued_t",
        "rid",
        "tag",
        "target_tokens",
        "text_tokens",
    )

    def __init__(self, rid: int, text_tokens: int, images: list[SimImage], target_tokens: int,
                 arrival: float = 0.0, notify: Callable[[SimRequest], None] | None = None,
                 tag: object = None) -> None:
        self.rid = rid
        self.text_tokens = text_tokens
        self.images = images
        self.prompt_tokens = text_tokens + sum(im.prompt_tokens for im in images)
        self.target_tokens = max(1, target_tokens)
        self.arrival = arrival
        self.queued_t: float | None = None  # taken into the scheduler (the step boundary after)
        self.admit_t: float | None = None  # first scheduled
        self.prefilled = 0
        self.emitted = 0
        self.first_token_t: float | None = None
        self.end_t: float | None = None
        self.hits = 0
        self.misses = 0
        self.notify = notify
        self.done = False
        self.tag = tag
        self.enc_ready = 0.0
        self.lookup_seq: int | None = None
        self.finish_seq: int | None = None


def _engine_cache(profile: Profile, target: CacheTarget, cache_size: float,
                  model: VisionModel | None) -> CacheModel:
    if target.front is None:
        return make_target_cache(target, None, target.capacity(cache_size))
    from ..vlm import resolve_model

    model = model or resolve_model(profile.model)
    budget = front_budget(target, model, profile.encoder_budget, profile.token_budget)
    return make_target_cache(target, model, target.capacity(cache_size), budget)


def encoder_cache(profile: Profile, target: CacheTarget, model: VisionModel | None
                  ) -> CacheModel | None:
    """vLLM's encoder cache beside a target looked up on arrival (``profile.encoder_cache``):
    asked at schedule time for the images, a hit skips encoding; None without one."""
    if not profile.encoder_cache or target.lookup != "arrival":
        return None
    from ..caches import get_target
    from ..media_tokens import encoder_cache_budget
    from ..vlm import resolve_model

    budget = profile.encoder_budget
    if budget is None:
        budget = encoder_cache_budget(model or resolve_model(profile.model), profile.token_budget,
                                      None, profile.max_model_len)
    return make_target_cache(get_target("vllm-encoder"), None, int(budget))


class Engine:
    """Waiting queue, running batch, embedding cache and the serial frontend of one worker."""

    def __init__(self, profile: Profile, cache_size: float | None,
                 model: VisionModel | None = None) -> None:
        """``cache_size`` is in the unit of the profile's cache target (GiB, MiB or tokens);
        None: the target's default. A two-tier target's front (vLLM's encoder cache) is the
        profile's ``encoder_budget``, else vLLM's rule for ``model`` (default: the profile's)
        with the profile's token budget."""
        self.p = profile
        self.target = profile.cache_target()
        self.cache_size = self.target.resolve(cache_size)
        self.cache = _engine_cache(profile, self.target, self.cache_size, model)
        self.encoder = encoder_cache(profile, self.target, model)
        self.cache_seq = 0  # cache events so far: lookups and finishes, in the order they happen
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.frontend_free = 0.0
        self.decoders_free = [0.0] * profile.decode_workers  # a min-heap of decoder free times
        self.encoder_free = 0.0
        self.steps = 0
        self.busy_ms = 0.0
        self.completed = 0
        self.encoded_images = 0
        self._scheduled: list[SimRequest] = []
        self._encoded_step: list[SimRequest] = []
        self._fresh: list[SimRequest] = []  # added since the last step began: not yet queued
        #: completed requests' time in each stage, summed (ms; ``metrics.STAGES``), their count
        self.stage_ms = dict.fromkeys(STAGES, 0.0)
        self.staged = 0

    # -- frontend -------------------------------------------------------------------------
    def _lookup(self, req: SimRequest) -> list[bool]:
        """The request's cache lookups (one event); per image, whether its embedding is at
        hand (a hit, or for a two-tier target a hit in either tier)."""
        target, images = self.target, req.images
        items = request_items(target, [im.key for im in images], [im.nbytes for im in images])
        flags = image_flags(target, self.cache.lookup(req.rid, items), len(images))
        req.lookup_seq = self.cache_seq
        self.cache_seq += 1
        front = self.cache.last_front
        req.hits = sum(flags)
        req.misses = len(flags) - req.hits - sum(front)  # a front tier's hits were not asked
        if front:  # served by the front tier: not encoded either
            return [hit or served for hit, served in zip(flags, front)]
        return flags

    def _finish(self, req: SimRequest) -> None:
        """The target's later moment for ``req`` (encoded, released or completed)."""
        if req.lookup_seq is None or req.finish_seq is not None:
            return
        self.cache.finish(req.rid)
        req.finish_seq = self.cache_seq
        self.cache_seq += 1

    def frontend_ready_at(self, req: SimRequest, now: float) -> float:
        """When the serial frontend hands ``req`` to the engine (reserves the frontend). A cache
        looked up on arrival (vLLM's processor cache) is consulted here, and a hit skips the
        image's preprocessing. Image decoding runs on the serial frontend, or first on the
        decoder pool when the profile has one (``decode_workers``)."""
        p = self.p
        fetch = p.url_fetch_ms if any(im.is_url for im in req.images) else 0.0
        ready = now + fetch
        decode = [p.decode_ms_per_mpixel * im.pixels / 1e6 for im in req.images
                  if im.pixels and p.decode_ms_per_mpixel]
        if decode and self.decoders_free:
            ready, decode = self._decoded_at(ready, decode), []
        processed = len(req.images)
        if self.target.lookup == "arrival":
            processed = sum(not hit for hit in self._lookup(req))
        cost = p.frontend_request_ms + p.frontend_image_ms * processed + sum(decode)
        if cost == 0.0:
            return ready
        start = max(ready, self.frontend_free)
        self.frontend_free = start + cost
        return self.frontend_free

    def _decoded_at(self, now: float, costs: list[float]) -> float:
        """When the decoder pool has decoded every image (each on the first free decoder)."""
        free, done = self.decoders_free, now
        for cost in costs:
            end = max(now, heapq.heappop(free)) + cost
            heapq.heappush(free, end)
            done = max(done, end)
        return done

    def add(self, req: SimRequest) -> None:
        """Put a request (past the frontend) in the waiting queue. The scheduler takes it in when
        the next step begins (vLLM's engine reads new requests between steps)."""
        self.waiting.append(req)
        self._fresh.append(req)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # -- steps ----------------------------------------------------------------------------
    def _admit(self, req: SimRequest, now: float) -> tuple[int, int]:
        """Schedule ``req`` at ``now``: its schedule-time cache lookups; returns the encoder work
        (tokens, images). With a cache looked up on arrival, every image is encoded (that cache
        holds processed pixels)."""
        req.admit_t = now
        if self.encoder is not None:  # beside a cache looked up on arrival
            flags = self.encoder.lookup(req.rid, [(im.key, im.tokens) for im in req.images])
        elif self.target.lookup == "arrival":
            flags = [False] * len(req.images)
        else:
            flags = self._lookup(req)
            if self.target.present == "encode":
                self._encoded_step.append(req)
        tokens = images = 0
        for im, hit in zip(req.images, flags):
            if not hit:
                tokens += im.tokens
                images += 1
        return tokens, images

    def _start_step(self, now: float) -> list[SimRequest]:
        """A step's start: the scheduler takes in the requests added since the last step
        (stamped queued now); returns the step's scheduled list, emptied."""
        for r in self._fresh:
            r.queued_t = now
        self._fresh.clear()
        self._scheduled.clear()
        return self._scheduled

    def begin_step(self, now: float = 0.0) -> float | None:
        """Schedule one step starting at ``now`` (ms) and return its duration in ms; None when
        nothing can run now (idle, or blocked on the encoder: see :meth:`next_wake`)."""
        p = self.p
        scheduled = self._start_step(now)
        budget = p.token_budget
        n_decode = prefill = context = 0
        enc_tokens = enc_images = 0.0
        for r in self.running:
            if r.prefilled >= r.prompt_tokens:
                n_decode += 1
                context += r.prompt_tokens
                scheduled.append(r)
        budget -= n_decode
        pairs = 0.0  # prefill tokens x their causal context (attention's quadratic part)
        prefilling = 0  # requests with prompt tokens in this step
        for r in self.running:
            if r.prefilled < r.prompt_tokens and budget > 0 and r.enc_ready <= now:
                chunk = min(r.prompt_tokens - r.prefilled, budget)
                pairs += chunk * (r.prefilled + chunk / 2)
                r.prefilled += chunk
                prefill += chunk
                budget -= chunk
                scheduled.append(r)
                prefilling += 1
        waiting, running = self.waiting, self.running
        frac = p.encoder_async_fraction
        while waiting and budget > 0 and len(running) < p.max_running:
            r = waiting.popleft()
            t, n = self._admit(r, now)
            running.append(r)
            cost = p.per_encoder_token_ms * t + p.per_encoder_image_ms * n
            if frac and cost:
                r.enc_ready = max(now, self.encoder_free) + cost * frac
                self.encoder_free = r.enc_ready
                enc_tokens += t * (1.0 - frac)
                enc_images += n * (1.0 - frac)
                self.encoded_images += n
                continue
            enc_tokens += t
            enc_images += n
            self.encoded_images += n
            chunk = min(r.prompt_tokens, budget)
            r.prefilled = chunk
            pairs += chunk * chunk / 2
            prefill += chunk
            budget -= chunk
            scheduled.append(r)
            prefilling += 1
        dur = (p.step_base_ms + p.per_seq_ms * n_decode + p.per_decode_context_ms * context / 1000.0
               + p.per_prefill_request_ms * prefilling
               + p.per_prefill_token_ms * prefill
               + p.per_prefill_context_ms * pairs / 1000.0
               + p.per_encoder_token_ms * enc_tokens + p.per_encoder_image_ms * enc_images)
        if not scheduled and not (enc_tokens or enc_images):
            return None
        self.steps += 1
        self.busy_ms += dur
        return dur

    def next_wake(self, now: float) -> float | None:
        """When a request blocked on the serial encoder becomes ready (None: none is blocked)."""
        times = [r.enc_ready for r in self.running
                 if r.prefilled < r.prompt_tokens and r.enc_ready > now]
        return min(times) if times else None

    def end_step(self, t_end: float) -> list[SimRequest]:
        """Emit the step's tokens at ``t_end``; returns the requests that finished."""
        finished: list[SimRequest] = []
        if self._encoded_step:
            for r in self._encoded_step:
                self._finish(r)
            self._encoded_step.clear()
        release = self.target.releases
        for r in self._scheduled:
            if r.done or r.prefilled < r.prompt_tokens:
                continue
            r.emitted += 1
            if r.emitted == 1:
                r.first_token_t = t_end
                if release:  # the prompt is computed: its encoder entries become freeable
                    self._finish(r)
                if self.encoder is not None:
                    self.encoder.finish(r.rid)
            if r.emitted >= r.target_tokens:
                r.end_t = t_end
                r.done = True
                finished.append(r)
            if r.notify is not None:
                r.notify(r)
        if finished:
            self.running = [r for r in self.running if not r.done]
            self.completed += len(finished)
            for r in finished:
                self._stages(r)
            if self.target.present == "completion":
                for r in finished:
                    self._finish(r)
        self._scheduled.clear()
        return finished

    def _stages(self, r: SimRequest) -> None:
        """Add a completed request's stages as vLLM's histograms split a request: before the
        scheduler (the frontend, then waiting for the step under way to end), waiting in it,
        scheduled to first token, first token to last."""
        if r.queued_t is None or r.admit_t is None or r.first_token_t is None or r.end_t is None:
            return
        ms = self.stage_ms
        ms["frontend"] += r.queued_t - r.arrival
        ms["queue"] += max(0.0, r.admit_t - r.queued_t)
        ms["prefill"] += r.first_token_t - max(r.admit_t, r.queued_t)
        ms["decode"] += r.end_t - r.first_token_t
        self.staged += 1

    def stages(self) -> dict:
        """The export's ``server_stages`` block of the requests completed so far."""
        return stage_block(self.stage_ms, self.staged, "the simulator's clock (simulated ms)")

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away); its slot frees at the next step."""
        req.done = True
        req.notify = None
        if self.encoder is not None:
            self.encoder.finish(req.rid)  # an aborted request's encoder entries are released
        if req.lookup_seq is not None and req.finish_seq is None:
            if self.target.releases:
                self._finish(req)  # its entries are released: an event the timeline shows
            else:
                self.cache.abort(req.rid)  # its pending entries never become present
        if req in self.waiting:
            self.waiting.remove(req)
        else:
            self.running = [r for r in self.running if r is not req]

    def instant(self, req: SimRequest, now: float) -> None:
        """Zero-delay path: admit, finish and register ``req`` at once (no steps, no queue)."""
        if self.target.lookup == "arrival":
            self._lookup(req)
        req.queued_t = now
        self._admit(req, now)
        self._encoded_step.clear()
        self._finish(req)
        if self.encoder is not None:
            self.encoder.finish(req.rid)  # its first token is now: its entries are released
        req.prefilled = req.prompt_tokens
        req.emitted = req.target_tokens
        req.first_token_t = req.end_t = now
        req.done = True
        self.completed += 1
        self._stages(req)
