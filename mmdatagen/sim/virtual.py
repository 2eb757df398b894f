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
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DatasetError, UserError
from ..io.readers import detect_format, iter_turns
from ..vlm import VisionModel, resolve_model
from .engine import Engine, SimImage, SimRequest
from .media import turn_media
from .profile import Profile
from .protocol import ImageResolver, RequestError, check_context, output_target


@dataclass
class SimTurn:
    """A dataset row reduced to what the engine needs."""

    session: str
    turn_index: int
    text_tokens: int
    images: list[SimImage]
    output_length: int | None = None
    delay_ms: float = 0.0
    prior_outputs: tuple[int | None, ...] = ()  # multi_turn: output_length of earlier turns


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
                raise UserError(f"session {row.session.lstrip(chr(0))} turn {row.turn_index}: "
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
    counter = 0
    multi = detect_format(Path(path)) == "multi_turn"
    history: dict[str, tuple[int, list[SimImage], tuple]] = {}
    for t in iter_turns(Path(path)):
        images = [_image(resolver, ref, (t.image_uuids or [None] * len(t.images))[i], path)
                  for i, ref in enumerate(t.images)]
        if not t.images and t.image_uuids:
            images = [resolver.resolve("", u) for u in t.image_uuids]
        if t.audios or t.videos:  # video/audio items: sim/media.py
            try:
                images += turn_media(t, resolver)
            except (RequestError, DatasetError) as exc:
                raise UserError(f"{path}: {getattr(exc, 'message', exc)}") from None
        text = sum(math.ceil(len(s.encode()) / bpt) for s in t.texts)
        sid = t.session_id
        if sid is None:
            sid = f"\x00row-{counter}"
        counter += 1
        prior: tuple = ()
        if multi:
            h_text, h_images, prior = history.get(sid, (0, [], ()))
            text, images = h_text + text, h_images + images
            history[sid] = (text, images, prior + (t.output_length,))
        out.append(SimTurn(sid, t.turn_index, text, images, t.output_length,
                           float(t.delay_ms or 0.0), prior))
    if not out:
        raise UserError(f"{path}: no rows")
    return out


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
    """Sessions in order of first appearance, cycled when the request count exceeds the rows."""

    def __init__(self, turns: list[SimTurn], wrap: bool = True) -> None:
        order: dict[str, list[SimTurn]] = {}
        for t in turns:
            order.setdefault(t.session, []).append(t)
        self.sessions = list(order.items())
        self.next = 0
        self.epoch = 0
        self.wrap = wrap

    def take(self) -> tuple[str, list[SimTurn]] | None:
        """The next session (None once a single pass is used up and ``wrap`` is off)."""
        if self.epoch > 0 and not self.wrap:
            return None
        sid, rows = self.sessions[self.next]
        label = sid.lstrip("\x00")
        label = label if self.epoch == 0 else f"{label}#{self.epoch}"
        self.next += 1
        if self.next == len(self.sessions):
            self.next, self.epoch = 0, self.epoch + 1
        return label, rows


def simulate(turns: list[SimTurn], profile: Profile, cache_gb: float, concurrency: int,
             request_count: int, warmup_count: int = 0, policy: OutputPolicy | None = None,
             streaming: bool = True, wrap: bool = True, request_rate: float | None = None,
             arrival: str = "poisson", seed: int = 0) -> SimResult:
    """Run warmup then profiling in virtual time; returns metrics RequestRecords.

    ``wrap``: cycle through the sessions again when the request count exceeds one pass
    (otherwise slots retire when the sessions run out, and a session always completes).
    ``request_rate``: profiling requests start on a paced schedule (poisson or constant, seeded
    like the loader's), each taken by the first free slot; ``concurrency`` is then a cap.
    """
    import numpy as np

    from ..metrics import RequestRecord

    if concurrency < 1 or request_count < 1 or warmup_count < 0:
        raise UserError("--concurrency and --request-count must be >= 1, warmup >= 0")
    if request_rate is not None and request_rate <= 0:
        raise UserError("--request-rate must be positive")
    policy = policy or OutputPolicy()
    policy.check(turns, profile)
    eng = Engine(profile, cache_gb)
    sessions = _Sessions(turns, wrap)
    gen = np.random.default_rng(seed)
    # per slot: [label, rows, next index]
    slots: list[list] = [[None, None, 0] for _ in range(concurrency)]
    records: list = []
    t = 0.0
    rid = 0
    for phase, cap in (("warmup", warmup_count), ("profiling", request_count)):
        issued = 0
        issue_heap: list[tuple[float, int, int]] = [(t, i, i) for i in range(concurrency)]
        heapq.heapify(issue_heap)
        arrivals: list[tuple[float, int, SimRequest]] = []
        in_flight = 0
        paced = request_rate is not None and phase == "profiling"
        next_slot: float | None = None
        ticketed: set[int] = set()
        while True:
            # issue every request whose slot is free (and, when paced, whose time has come)
            while issue_heap and issue_heap[0][0] <= t:
                due, seq, s = heapq.heappop(issue_heap)
                if issued >= cap and s not in ticketed:
                    continue  # the request count is used up: this slot stops
                slot = slots[s]
                if slot[1] is None or slot[2] >= len(slot[1]):
                    nxt_session = sessions.take()
                    if nxt_session is None:
                        continue  # one pass done: this slot retires
                    slot[0], slot[1] = nxt_session
                    slot[2] = 0
                if paced and s not in ticketed:
                    if next_slot is None:
                        next_slot = due
                    ticket = next_slot
                    gap = 1.0 / request_rate if arrival == "constant" else float(
                        gen.exponential(1.0 / request_rate))
                    next_slot += gap * 1000.0
                    issued += 1
                    if ticket > due:
                        ticketed.add(s)
                        heapq.heappush(issue_heap, (ticket, seq, s))
                        continue
                elif s in ticketed:
                    ticketed.discard(s)
                else:
                    issued += 1
                row = slot[1][slot[2]]
                slot[2] += 1
                text = row.text_tokens
                for ol in row.prior_outputs:
                    text += reply_tokens(policy.target(profile.natural_output_tokens, ol),
                                         profile.text_bytes_per_token)
                sreq = SimRequest(rid, text, row.images,
                                  policy.target(profile.natural_output_tokens, row.output_length),
                                  arrival=due, tag=(s, slot[0], row, phase))
                rid += 1
                in_flight += 1
                ready = eng.frontend_ready_at(sreq, due)
                heapq.heappush(arrivals, (ready, sreq.rid, sreq))
            while arrivals and arrivals[0][0] <= t:
                eng.add(heapq.heappop(arrivals)[2])
            if in_flight == 0 and not ticketed and (issued >= cap or not issue_heap):
                break
            if eng.idle:
                nxt = [arrivals[0][0]] if arrivals else []
                if issue_heap and (issued < cap or ticketed):
                    nxt.append(issue_heap[0][0])
                t = max(t, min(nxt))
                continue
            dur = eng.begin_step(t)
            if dur is None:  # everything runnable is blocked on the serial encoder
                nxt = [x for x in (eng.next_wake(t),) if x is not None]
                if arrivals:
                    nxt.append(arrivals[0][0])
                if issue_heap and (issued < cap or ticketed):
                    nxt.append(issue_heap[0][0])
                if not nxt:
                    raise RuntimeError("simulator stalled: requests wait but nothing can run")
                t = max(t, min(nxt))
                continue
            t += dur
            for r in eng.end_step(t):
                in_flight -= 1
                s, label, row, ph = r.tag
                records.append(RequestRecord(
                    conversation_id=label, turn_index=row.turn_index, phase=ph,
                    start_ns=round(r.arrival * 1e6), first_token_ns=round(r.first_token_t * 1e6),
                    end_ns=round(r.end_t * 1e6), output_tokens=r.emitted,
                    input_tokens=r.prompt_tokens, num_images=len(row.images), error=None,
                    image_hits=r.hits, image_misses=r.misses,
                    server_ttft_ns=round((r.first_token_t - r.arrival) * 1e6),
                    x_request_id=f"sim-{r.rid}", streaming=streaming,
                    response_end_ns=round(r.end_t * 1e6)))
                slot = slots[s]
                delay = slot[1][slot[2]].delay_ms if slot[2] < len(slot[1]) else 0.0
                heapq.heappush(issue_heap, (t + delay, r.rid, s))
    return SimResult(records, eng, t)


def run_simulation(dataset: Path, profile: Profile, cache_gb: float, concurrency: int,
                   request_count: int | None, warmup_count: int, policy: OutputPolicy,
                   streaming: bool = True, request_rate: float | None = None,
                   arrival: str = "poisson", seed: int = 0,
                   model: VisionModel | None = None) -> SimResult:
    """``request_count`` None: one pass over the dataset (every session completes)."""
    turns = load_turns(dataset, profile, model)
    return simulate(turns, profile, cache_gb, concurrency,
                    request_count if request_count else len(turns), warmup_count, policy,
                    streaming, wrap=request_count is not None, request_rate=request_rate,
                    arrival=arrival, seed=seed)


SWEEP_COLUMNS = (("cache_gb", "Cache GiB"), ("hit_rate", "Hit rate %"),
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
        for tag in ("output_token_throughput", "time_to_first_token", "inter_token_latency",
                    "request_latency"):
            row[tag] = (ex.get(tag) or {}).get("avg")
        rows.append(row)
    return rows


def sweep_table(rows: list[dict]) -> str:
    """Plain-text table of :func:`sweep_cache` rows."""
    head = [h for _, h in SWEEP_COLUMNS]
    body = [[("-" if r[k] is None else f"{r[k]:,.2f}" if k != "cache_gb" else f"{r[k]:g}")
             for k, _ in SWEEP_COLUMNS] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
