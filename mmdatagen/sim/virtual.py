"""``mmdatagen simulate``: a whole benchmark in virtual time (no HTTP, no sleeping).

The dispatch follows AIPerf's rules (aiperf-compat.md): ``concurrency`` slots; rows sharing a
``session_id`` form one session replayed causally (next row after the previous completes, plus
its ``delay``); concurrency counts sessions, ``request_count`` counts requests; warmup requests
come first from the same sequence and are drained before profiling starts (profiling continues
where warmup stopped). ``timestamp`` schedules are not modelled. The client and network are
instantaneous, so TTFT = server time from arrival to the first token.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

from ..arrivals import Pacer, make_pacer
from ..errors import DatasetError, UserError
from ..io.readers import Turn, detect_format, iter_turns
from ..sessions import Cycle, epoch_label, group_rows, row_key, row_label
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


class _Sessions:
    """The dataset's sessions in the order they start (``mmdatagen.sessions``), labelled by
    pass; cycled when the request count exceeds the rows unless ``wrap`` is off."""

    def __init__(self, turns: list[SimTurn], wrap: bool = True) -> None:
        keys = (t.session if t.key is None else t.key for t in turns)
        self.sessions = [[turns[i] for i in rows] for rows in group_rows(keys)]
        self.cycle = Cycle(len(self.sessions), wrap)

    def take(self) -> tuple[str, list[SimTurn]] | None:
        """The next session's label and rows (None once a single pass is used up and ``wrap``
        is off)."""
        nxt = self.cycle.take()
        if nxt is None:
            return None
        rows = self.sessions[nxt[0]]
        return epoch_label(rows[0].session, nxt[1]), rows


@dataclass
class _Phase:
    """One phase's dispatch state: free slots by time, frontend queue, tickets of paced slots."""

    name: str
    cap: int
    pacer: Pacer | None
    issue_heap: list[tuple[float, int, int]]
    issued: int = 0
    in_flight: int = 0
    arrivals: list[tuple[float, int, SimRequest]] = field(default_factory=list)
    ticketed: set[int] = field(default_factory=set)

    def waiting(self) -> bool:
        """A slot may still issue (count left, or a paced slot holds a ticket)."""
        return bool(self.issue_heap) and (self.issued < self.cap or bool(self.ticketed))

    def done(self) -> bool:
        return self.in_flight == 0 and not self.ticketed and (self.issued >= self.cap
                                                              or not self.issue_heap)


class _VirtualRun:
    """Slots replaying sessions causally against one engine, in virtual milliseconds."""

    def __init__(self, turns: list[SimTurn], profile: Profile, cache_size: float, concurrency: int,
                 policy: OutputPolicy, streaming: bool, wrap: bool,
                 model: VisionModel | None = None) -> None:
        self.profile, self.policy, self.streaming = profile, policy, streaming
        self.eng = Engine(profile, cache_size, model)
        self.sessions = _Sessions(turns, wrap)
        self.slots: list[list] = [[None, None, 0] for _ in range(concurrency)]  # label, rows, next
        self.records: list = []
        self.t = 0.0
        self.rid = 0

    def run_phase(self, name: str, cap: int, pacer: Pacer | None) -> None:
        heap = [(self.t, i, i) for i in range(len(self.slots))]
        heapq.heapify(heap)
        ph = _Phase(name, cap, pacer, heap)
        while True:
            self._issue_due(ph)
            while ph.arrivals and ph.arrivals[0][0] <= self.t:
                self.eng.add(heapq.heappop(ph.arrivals)[2])
            if ph.done():
                return
            self._advance(ph)

    def _issue_due(self, ph: _Phase) -> None:
        """Issue every request whose slot is free (and, when paced, whose time has come)."""
        while ph.issue_heap and ph.issue_heap[0][0] <= self.t:
            due, seq, s = heapq.heappop(ph.issue_heap)
            if ph.issued >= ph.cap and s not in ph.ticketed:
                continue  # the request count is used up: this slot stops
            if not self._has_row(s):
                continue  # one pass done: this slot retires
            if ph.pacer is not None and s not in ph.ticketed:
                ticket = ph.pacer.take(due)
                ph.issued += 1
                if ticket > due:
                    ph.ticketed.add(s)
                    heapq.heappush(ph.issue_heap, (ticket, seq, s))
                    continue
            elif s in ph.ticketed:
                ph.ticketed.discard(s)
            else:
                ph.issued += 1
            self._send(ph, s, due)

    def _has_row(self, s: int) -> bool:
        slot = self.slots[s]
        if slot[1] is None or slot[2] >= len(slot[1]):
            nxt_session = self.sessions.take()
            if nxt_session is None:
                return False
            slot[0], slot[1] = nxt_session
            slot[2] = 0
        return True

    def _send(self, ph: _Phase, s: int, due: float) -> None:
        slot, prof = self.slots[s], self.profile
        row = slot[1][slot[2]]
        slot[2] += 1
        text = row.text_tokens
        for ol in row.prior_outputs:
            text += reply_tokens(self.policy.target(prof.natural_output_tokens, ol),
                                 prof.text_bytes_per_token)
        sreq = SimRequest(self.rid, text, row.images,
                          self.policy.target(prof.natural_output_tokens, row.output_length),
                          arrival=due, tag=(s, slot[0], row, ph.name))
        self.rid += 1
        ph.in_flight += 1
        heapq.heappush(ph.arrivals, (self.eng.frontend_ready_at(sreq, due), sreq.rid, sreq))

    def _advance(self, ph: _Phase) -> None:
        """Move virtual time: to the next event when idle or blocked, else by one engine step."""
        eng = self.eng
        if eng.idle:
            nxt = [ph.arrivals[0][0]] if ph.arrivals else []
            if ph.waiting():
                nxt.append(ph.issue_heap[0][0])
            self.t = max(self.t, min(nxt))
            return
        dur = eng.begin_step(self.t)
        if dur is None:  # everything runnable is blocked on the serial encoder
            nxt = [x for x in (eng.next_wake(self.t),) if x is not None]
            if ph.arrivals:
                nxt.append(ph.arrivals[0][0])
            if ph.waiting():
                nxt.append(ph.issue_heap[0][0])
            if not nxt:
                raise RuntimeError("simulator stalled: requests wait but nothing can run")
            self.t = max(self.t, min(nxt))
            return
        self.t += dur
        for r in eng.end_step(self.t):
            ph.in_flight -= 1
            self._record(r)
            s = r.tag[0]  # type: ignore[index]
            slot = self.slots[s]
            delay = slot[1][slot[2]].delay_ms if slot[2] < len(slot[1]) else 0.0
            heapq.heappush(ph.issue_heap, (self.t + delay, r.rid, s))

    def _record(self, r: SimRequest) -> None:
        from ..metrics import RequestRecord

        tag: tuple[int, str, SimTurn, str] = r.tag  # type: ignore[assignment]  # set by _send
        _, label, row, ph = tag
        assert r.first_token_t is not None and r.end_t is not None  # a completed request
        self.records.append(RequestRecord(
            conversation_id=label, turn_index=row.turn_index, phase=ph,
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
    from ..spec.base import check_values
    from ..spec.sim import VirtualRun

    check_values(VirtualRun, concurrency=concurrency, request_count=request_count,
                 warmup_request_count=warmup_count, request_rate=request_rate)
    policy = policy or OutputPolicy()
    policy.check(turns, profile)
    run = _VirtualRun(turns, profile, cache_size, concurrency, policy, streaming, wrap, model)
    run.run_phase("warmup", warmup_count, None)
    pacer = make_pacer(request_rate, arrival, seed, unit=1000.0, burstiness=burstiness,
                       ramp_to=ramp_to, count=request_count)
    run.run_phase("profiling", request_count, pacer)
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


SWEEP_COLUMNS = (("cache_gb", "Cache {unit}"), ("hit_rate", "Hit rate %"),
                 ("output_token_throughput", "Output TPS"), ("time_to_first_token", "TTFT avg ms"),
                 ("ttft_p50", "TTFT p50 ms"), ("inter_token_latency", "ITL avg ms"),
                 ("request_latency", "Latency avg ms"))


def sweep_cache(turns: list[SimTurn], profile: Profile, sizes_gb: list[float], **kw) -> list[dict]:
    """One virtual run per cache size: hit rate (profiling) and headline metrics."""
    from ..export import build_export

    rows = []
    for gb in sizes_gb:
        res = simulate(turns, profile, gb, **kw)
        ex = build_export(res.records, input_config={})
        prof = [r for r in res.records if r.phase == "profiling"]
        refs = sum(r.image_hits + r.image_misses for r in prof)
        row = {"cache_gb": gb,
               "hit_rate": 100.0 * sum(r.image_hits for r in prof) / refs if refs else None,
               "ttft_p50": (ex.get("time_to_first_token") or {}).get("p50")}
        counters = res.engine.cache.counters() if res.engine is not None else {}
        if "encoder_hits" in counters:  # two tiers: the front's hits (whole run) beside
            row["encoder_hits"] = counters["encoder_hits"]
        for tag in ("output_token_throughput", "time_to_first_token", "inter_token_latency",
                    "request_latency"):
            row[tag] = (ex.get(tag) or {}).get("avg")
        rows.append(row)
    return rows


def sweep_table(rows: list[dict], unit: str = "GiB") -> str:
    """Plain-text table of :func:`sweep_cache` rows; sizes in the cache target's ``unit``."""
    cols: tuple[tuple[str, str], ...] = SWEEP_COLUMNS
    if rows and "encoder_hits" in rows[0]:
        cols = (*cols[:2], ("encoder_hits", "Encoder-cache hits"), *cols[2:])
    head = [h.format(unit=unit) for _, h in cols]
    body = [[("-" if r[k] is None else f"{r[k]:,.2f}" if k not in ("cache_gb", "encoder_hits")
              else f"{r[k]:g}") for k, _ in cols] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
