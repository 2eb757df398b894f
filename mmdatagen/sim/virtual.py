"""``mmdatagen simulate``: a whole benchmark in virtual time (no HTTP, no sleeping).

The dispatch is the loader's: the dispatch core (``mmdatagen.scheduling``: ``concurrency``
slots replaying sessions causally, warmup drained before profiling, the arrival process) driven
by a virtual clock. ``timestamp`` schedules are not modelled. The client and network are
instantaneous, so TTFT = server time from arrival to the first token.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

from ..arrivals import make_pacer
from ..errors import DatasetError, UserError
from ..io.readers import Turn, detect_format, iter_turns
from ..scheduling import SEND, WAIT, Core, Phase, Slot, phases
from ..sessions import Replay, Replayed, epoch_label, group_rows, row_key, row_label
from ..vlm import VisionModel, resolve_model
from .engine import Engine, SimImage, SimRequest
from .media import turn_media
from .profile import Profile
from .protocol import ImageResolver, RequestError, check_context, output_target


@dataclass
class SimTurn:
    """A dataset row reduced to what the engine needs (``session``: its session's label,
    ``key``: its grouping key, both from ``mmdatagen.sessions``)."""

    session: str
    turn_index: int
    text_tokens: int
    images: list[SimImage]
    output_length: int | None = None
    delay_ms: float = 0.0
    prior_outputs: tuple[int | None, ...] = ()  # multi_turn: output_length of earlier turns
    key: Hashable = None


@dataclass
class OutputPolicy:
    """max_tokens / min_tokens / ignore_eos as sent with every request (``--extra-inputs``)."""

    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False

    def target(self, natural: int, row_max: int | None) -> int:
        """Output tokens of a row: the server's rule (``protocol.output_target``)."""
        mx = row_max if row_max is not None else self.max_tokens
        return output_target(natural, mx, self.min_tokens, self.ignore_eos)[0]

    def check(self, turns: list[SimTurn], profile: Profile) -> None:
        """Refuse what ``serve`` answers with 400: min above max, or prompt plus output beyond
        the model's context (``protocol.check_context``), naming the first such row."""
        natural = profile.natural_output_tokens
        for row in turns:
            mx = row.output_length if row.output_length is not None else self.max_tokens
            prompt = row.text_tokens + sum(im.prompt_tokens for im in row.images) + sum(
                reply_tokens(self.target(natural, ol), profile.text_bytes_per_token)
                for ol in row.prior_outputs)
            try:
                target, _ = output_target(natural, mx, self.min_tokens, self.ignore_eos)
                check_context(profile, prompt, target, mx)
            except RequestError as exc:
                raise UserError(f"session {row.session} turn {row.turn_index}: "
                                f"{exc.message} (the server answers 400)") from None


def load_turns(path: Path, profile: Profile, model: VisionModel | None = None) -> list[SimTurn]:
    """Read a dataset once into compact turns (images resolved to keys, tokens, bytes).

    ``multi_turn`` requests carry their whole history, as the loader sends it: earlier turns'
    texts and images, plus the assistant replies (added at simulation time, see
    :func:`reply_tokens`). ``single_turn`` rows with a ``session_id`` carry only themselves.
    """
    model = model or resolve_model(profile.model)
    resolver = ImageResolver(model, profile, allow_paths=True,
                             dataset_dir=Path(path).resolve().parent)
    bpt = profile.text_bytes_per_token
    out: list[SimTurn] = []
    multi = detect_format(Path(path)) == "multi_turn"
    line: Hashable = None  # multi_turn: the line whose history is held
    history: tuple[int, list[SimImage], tuple] = (0, [], ())
    for t in iter_turns(Path(path)):
        images = _turn_images(t, resolver, path)
        text = sum(math.ceil(len(s.encode()) / bpt) for s in t.texts)
        key = row_key(t.session_id, t.line_no, multi)
        prior: tuple = ()
        if multi:
            h_text, h_images, prior = history if key == line else (0, [], ())
            text, images = h_text + text, h_images + images
            line, history = key, (text, images, prior + (t.output_length,))
        out.append(SimTurn(row_label(t.session_id, t.line_no), t.turn_index, text, images,
                           t.output_length, float(t.delay_ms or 0.0), prior, key))
    if not out:
        raise UserError(f"{path}: no rows")
    return out


def _turn_images(t: Turn, resolver: ImageResolver, path: Path) -> list[SimImage]:
    """A row's images (and video/audio items, ``sim/media.py``) as the engine prices them."""
    uuids: list[str | None] = [*t.image_uuids] if t.image_uuids else [None] * len(t.images)
    images = [_image(resolver, ref, uuids[i], path) for i, ref in enumerate(t.images)]
    if not t.images and t.image_uuids:
        images = [resolver.resolve("", u) for u in t.image_uuids]
    if t.audios or t.videos:
        try:
            images += turn_media(t, resolver)
        except (RequestError, DatasetError) as exc:
            raise UserError(f"{path}: {getattr(exc, 'message', exc)}") from None
    return images


def _image(resolver: ImageResolver, ref: str, uuid: str | None, path: Path) -> SimImage:
    try:
        return resolver.resolve(ref, uuid)
    except RequestError as exc:
        raise UserError(f"{path}: {exc.message}") from None


def reply_tokens(n: int, bytes_per_token: float) -> int:
    """Prompt tokens the server counts for an earlier reply of ``n`` simulated tokens."""
    from .protocol import WORDS

    size = sum(len(WORDS[i % len(WORDS)].encode()) for i in range(n))
    return math.ceil(size / bytes_per_token) if size else 0


@dataclass
class SimResult:
    records: list = field(default_factory=list)
    engine: Engine | None = None
    duration_ms: float = 0.0


def session_feed(turns: list[SimTurn], wrap: bool = True) -> Replay[SimTurn]:
    """The dataset's sessions in the order they start (``mmdatagen.sessions``), cycled when the
    request count exceeds the rows unless ``wrap`` is off: the dispatch core's feed."""
    keys = (t.session if t.key is None else t.key for t in turns)
    return Replay([[turns[i] for i in rows] for rows in group_rows(keys)], wrap)


def session_label(session: Replayed[SimTurn]) -> str:
    """A session's name in records: its label, ``#pass`` from the second pass on."""
    return epoch_label(session.rows[0].session, session.epoch)


class _VirtualRun:
    """The dispatch core (``mmdatagen.scheduling``) driven in virtual milliseconds against one
    engine: an event loop of slot times (``due``: when a slot asks the core next, after a
    completion plus the next turn's ``delay``, or at a paced ticket's time), frontend arrivals
    and engine steps. When a phase opens, every live slot asks at once, in slot order."""

    def __init__(self, turns: list[SimTurn], profile: Profile, cache_size: float, concurrency: int,
                 policy: OutputPolicy, streaming: bool, wrap: bool, run_phases: list[Phase],
                 model: VisionModel | None = None) -> None:
        self.profile, self.policy, self.streaming = profile, policy, streaming
        self.eng = Engine(profile, cache_size, model)
        self.core: Core[Replayed[SimTurn], SimTurn] = Core(session_feed(turns, wrap), run_phases)
        self.slots = [self.core.add_slot() for _ in range(concurrency)]
        self.due: list[tuple[float, int, int]] = [(0.0, i, i) for i in range(concurrency)]
        self.arrivals: list[tuple[float, int, SimRequest]] = []
        self.records: list = []
        self.t = 0.0
        self.rid = 0

    def run(self) -> None:
        while True:
            self._issue_due()
            while self.arrivals and self.arrivals[0][0] <= self.t:
                self.eng.add(heapq.heappop(self.arrivals)[2])
            if self.core.finished():
                return
            self._advance()

    def _issue_due(self) -> None:
        """Ask the core for every slot whose time has come."""
        while self.due and self.due[0][0] <= self.t:
            due, seq, s = heapq.heappop(self.due)
            slot = self.slots[s]
            step = self.core.next(slot, due)
            if step == SEND:
                self._send(slot, due)
            elif step == WAIT:  # a paced ticket: ask again at its time
                heapq.heappush(self.due, (slot.at, seq, s))
            self._phase_opened()  # HOLD: released when the phase opens; DONE: the slot stops

    def _phase_opened(self) -> None:
        if self.core.released:
            self.core.released.clear()
            self.due = [(self.t, i, i) for i, slot in enumerate(self.slots) if not slot.retired]

    def _send(self, slot: Slot[Replayed[SimTurn], SimTurn], due: float) -> None:
        prof, row = self.profile, slot.turn
        assert row is not None and slot.session is not None  # the core sends a turn
        text = row.text_tokens
        for ol in row.prior_outputs:
            text += reply_tokens(self.policy.target(prof.natural_output_tokens, ol),
                                 prof.text_bytes_per_token)
        sreq = SimRequest(self.rid, text, row.images,
                          self.policy.target(prof.natural_output_tokens, row.output_length),
                          arrival=due, tag=(slot.index, session_label(slot.session), row,
                                            slot.phase, slot.session.pos - 1))
        self.rid += 1
        heapq.heappush(self.arrivals, (self.eng.frontend_ready_at(sreq, due), sreq.rid, sreq))

    def _advance(self) -> None:
        """Move virtual time: to the next event when idle or blocked, else by one engine step."""
        eng = self.eng
        if eng.idle:
            nxt = [self.arrivals[0][0]] if self.arrivals else []
            if self.due and self.core.may_issue():
                nxt.append(self.due[0][0])
            self.t = max(self.t, min(nxt))
            return
        dur = eng.begin_step(self.t)
        if dur is None:  # everything runnable is blocked on the serial encoder
            nxt = [x for x in (eng.next_wake(self.t),) if x is not None]
            if self.arrivals:
                nxt.append(self.arrivals[0][0])
            if self.due and self.core.may_issue():
                nxt.append(self.due[0][0])
            if not nxt:
                raise RuntimeError("simulator stalled: requests wait but nothing can run")
            self.t = max(self.t, min(nxt))
            return
        self.t += dur
        for r in eng.end_step(self.t):
            self._record(r)
            s = r.tag[0]  # type: ignore[index]
            turn = self.core.complete(self.slots[s], self.t)
            delay = turn.delay_ms if turn is not None else 0.0
            heapq.heappush(self.due, (self.t + delay, r.rid, s))
            self._phase_opened()

    def _record(self, r: SimRequest) -> None:
        from ..metrics import RequestRecord

        # set by _send; the turn's index is its order in the session, as the loader numbers it
        tag: tuple[int, str, SimTurn, str, int] = r.tag  # type: ignore[assignment]
        _, label, row, ph, index = tag
        assert r.first_token_t is not None and r.end_t is not None  # a completed request
        self.records.append(RequestRecord(
            conversation_id=label, turn_index=index, phase=ph,
            start_ns=round(r.arrival * 1e6), first_token_ns=round(r.first_token_t * 1e6),
            end_ns=round(r.end_t * 1e6), output_tokens=r.emitted,
            input_tokens=r.prompt_tokens, num_images=len(row.images), error=None,
            image_hits=r.hits, image_misses=r.misses,
            server_ttft_ns=round((r.first_token_t - r.arrival) * 1e6),
            x_request_id=f"sim-{r.rid}", streaming=self.streaming,
            response_end_ns=round(r.end_t * 1e6)))


def simulate(turns: list[SimTurn], profile: Profile, cache_size: float, concurrency: int,
             request_count: int, warmup_count: int = 0, policy: OutputPolicy | None = None,
             streaming: bool = True, wrap: bool = True, request_rate: float | None = None,
             arrival: str = "poisson", seed: int = 0,
             model: VisionModel | None = None, burstiness: float = 1.0,
             ramp_to: float | None = None) -> SimResult:
    """Run warmup then profiling in virtual time; returns metrics RequestRecords.

    ``wrap``: cycle through the sessions again when the request count exceeds one pass
    (otherwise slots retire when the sessions run out, and a session always completes).
    ``request_rate``: profiling requests start on a paced schedule (poisson, constant or gamma,
    optionally ramped to ``ramp_to``, seeded like the loader's: ``arrivals.Pacer``), each taken
    by the first free slot; ``concurrency`` is then a cap.
    """
    from ..settings.base import check_values
    from ..settings.sim import VirtualRun

    check_values(VirtualRun, concurrency=concurrency, request_count=request_count,
                 warmup_request_count=warmup_count, request_rate=request_rate)
    policy = policy or OutputPolicy()
    policy.check(turns, profile)
    pacer = make_pacer(request_rate, arrival, seed, unit=1000.0, burstiness=burstiness,
                       ramp_to=ramp_to, count=request_count)
    run = _VirtualRun(turns, profile, cache_size, concurrency, policy, streaming, wrap,
                      phases(warmup_count, request_count, pacer), model)
    run.run()
    return SimResult(run.records, run.eng, run.t)


def run_simulation(dataset: Path, profile: Profile, cache_size: float, concurrency: int,
                   request_count: int | None, warmup_count: int, policy: OutputPolicy,
                   streaming: bool = True, request_rate: float | None = None,
                   arrival: str = "poisson", seed: int = 0,
                   model: VisionModel | None = None, burstiness: float = 1.0,
                   ramp_to: float | None = None) -> SimResult:
    """``request_count`` None: one pass over the dataset (every session completes)."""
    turns = load_turns(dataset, profile, model)
    return simulate(turns, profile, cache_size, concurrency,
                    request_count if request_count else len(turns), warmup_count, policy,
                    streaming, wrap=request_count is not None, request_rate=request_rate,
                    arrival=arrival, seed=seed, model=model, burstiness=burstiness,
                    ramp_to=ramp_to)


def sweep_cache(turns: list[SimTurn], profile: Profile, sizes: list[float], **kw) -> list[dict]:
    """One virtual run per cache size (in the target's unit): hit rate (profiling) and headline
    metrics (the what-if's rows: ``sim.whatif``)."""
    from ..export import build_export

    rows = []
    for size in sizes:
        res = simulate(turns, profile, size, **kw)
        ex = build_export(res.records, input_config={})
        prof = [r for r in res.records if r.phase == "profiling"]
        refs = sum(r.image_hits + r.image_misses for r in prof)
        row = {"cache_gb": size,  # the what-if's rows keep the export name
               "hit_rate": 100.0 * sum(r.image_hits for r in prof) / refs if refs else None,
               "ttft_p50": (ex.get("time_to_first_token") or {}).get("p50"),
               "ttft_p99": (ex.get("time_to_first_token") or {}).get("p99")}
        counters = res.engine.cache.counters() if res.engine is not None else {}
        if "encoder_hits" in counters:  # two tiers: the front's hits (whole run) beside
            row["encoder_hits"] = counters["encoder_hits"]
        for tag in ("output_token_throughput", "time_to_first_token", "inter_token_latency",
                    "request_latency", "request_throughput"):
            row[tag] = (ex.get(tag) or {}).get("avg")
        rows.append(row)
    return rows
