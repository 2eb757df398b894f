"""Engine model, embedding cache, profiles and the virtual-time dispatch."""
from __future__ import annotations

import random
from collections import OrderedDict
from pathlib import Path

import orjson
import pytest
from sim_helpers import fast_profile, png_url

from mmdatagen.caches.model import OrderedCache
from mmdatagen.errors import UserError
from mmdatagen.sim.engine import Engine, SimImage, SimRequest
from mmdatagen.sim.profile import load_profile, profile_from_dict
from mmdatagen.sim.virtual import OutputPolicy, load_turns, simulate


class EmbeddingCache(OrderedCache):
    """Dynamo's aggregated embedding cache (a byte LRU that skips entries larger than its
    capacity) driven the old way: ``lookup(key)`` counts a query and refreshes a hit,
    ``insert`` adds. The library's callers pass a request's items to ``lookup`` instead."""

    def lookup(self, key, items=None):
        if items is not None:
            return super().lookup(key, items)
        hit = self._count(key in self._data)
        if hit:
            self._data.move_to_end(key)
        return hit


def test_cache_lru_matches_reference_and_skips_oversize():
    rnd = random.Random(1)
    cap = 1000
    c = EmbeddingCache(cap)
    ref: OrderedDict[str, int] = OrderedDict()
    hits = 0
    for _ in range(3000):
        k = f"k{rnd.randrange(40)}"
        size = 50 + int(k[1:]) * 5
        if k in ref:
            ref.move_to_end(k)
            hits += 1
        elif size <= cap:
            while sum(ref.values()) + size > cap:
                ref.popitem(last=False)
            ref[k] = size
        c.lookup(k)
        c.insert(k, size)
    assert c.keys() == list(ref)
    assert c.hits == hits and c.queries == 3000 and c.bytes == sum(ref.values())
    c.insert("huge", cap + 1)
    assert "huge" not in c and c.keys() == list(ref)
    off = EmbeddingCache(0)
    off.insert("a", 1)
    assert not off.lookup("a") and len(off) == 0


def _img(key: str, tokens: int = 100) -> SimImage:
    return SimImage(key, tokens, tokens + 2, tokens * 4096)


def test_step_model_times_by_hand():
    prof = fast_profile(step_base_ms=10.0, per_seq_ms=1.0, per_prefill_token_ms=0.01,
                        per_encoder_token_ms=0.1, per_encoder_image_ms=2.0, token_budget=1000)
    eng = Engine(prof, 1.0)
    a = SimRequest(0, 98, [_img("x")], target_tokens=3)  # 200 prompt tokens
    b = SimRequest(1, 1800, [], target_tokens=2)         # needs two chunks
    eng.add(a)
    eng.add(b)
    # step 1: admit a (200 + encoder 100 tokens + 1 image) and 800 tokens of b
    assert eng.begin_step() == pytest.approx(10 + 0.01 * 1000 + 0.1 * 100 + 2.0)
    eng.end_step(32.0)
    assert (a.emitted, a.first_token_t, b.emitted) == (1, 32.0, 0)
    # step 2: decode a (1 seq), remaining 1000 tokens of b exceed 999 left: 999 prefilled
    assert eng.begin_step() == pytest.approx(10 + 1 + 0.01 * 999)
    eng.end_step(52.0)
    assert (a.emitted, b.emitted) == (2, 0)
    assert eng.begin_step() == pytest.approx(10 + 1 + 0.01 * 1)
    fin = eng.end_step(70.0)
    assert fin == [a] and a.end_t == 70.0 and b.first_token_t == 70.0
    assert (eng.cache.hits, eng.cache.misses) == (0, 1)


def test_max_running_queues_and_register_modes():
    prof = fast_profile(max_running=1)
    eng = Engine(prof, 1.0)
    r1, r2 = SimRequest(0, 10, [_img("x")], 2), SimRequest(1, 10, [_img("x")], 2)
    eng.add(r1)
    eng.add(r2)
    t = 0.0
    while not eng.idle:
        t += eng.begin_step()
        eng.end_step(t)
    assert r2.first_token_t > r1.end_t - 1e-9  # r2 waited for the only slot
    # the default target is Dynamo's two tiers: r2's image is still in vLLM's encoder cache,
    # so Dynamo is not asked (neither a hit nor a miss there)
    assert (r1.misses, r2.hits, r2.misses) == (1, 0, 0)
    assert eng.cache.counters()["encoder_hits"] == 1
    # the registration moment, on a single-tier cache that can move it
    for register, expect_hits in (("schedule", 1), ("encode", 0), ("completion", 0)):
        eng = Engine(fast_profile(cache="dynamo-encode", register=register), 1.0)
        r1, r2 = SimRequest(0, 10, [_img("x")], 3), SimRequest(1, 10, [_img("x")], 3)
        eng.add(r1)
        eng.add(r2)  # admitted in the same step: an in-flight duplicate
        eng.begin_step()
        eng.end_step(1.0)
        assert r2.hits == expect_hits, register
    # encode registers at the end of the encoder's step; completion only when r finishes
    eng = Engine(fast_profile(cache="dynamo-encode", register="encode"), 1.0)
    eng.add(SimRequest(0, 10, [_img("y")], 5))
    eng.begin_step()
    eng.end_step(1.0)
    assert "y" in eng.cache
    eng = Engine(fast_profile(cache="dynamo-encode", register="completion"), 1.0)
    eng.add(SimRequest(0, 10, [_img("y")], 2))
    eng.begin_step()
    eng.end_step(1.0)
    assert "y" not in eng.cache
    eng.begin_step()
    eng.end_step(2.0)
    assert "y" in eng.cache


def test_profiles_ship_and_reject_bad_values(tmp_path):
    for name in ("qwen3-vl-30b-gb200", "zero-delay"):
        p = load_profile(name)
        assert p.name == name
    assert load_profile("zero-delay").zero_delay
    assert not load_profile("qwen3-vl-30b-gb200").zero_delay
    with pytest.raises(UserError, match="unknown keys"):
        profile_from_dict({"step_base": 1})
    with pytest.raises(UserError, match="negative"):
        profile_from_dict({"step_base_ms": -1})
    with pytest.raises(UserError, match="key_mode"):
        profile_from_dict({"key_mode": "nope"})
    with pytest.raises(UserError, match="must be a number"):
        profile_from_dict({"step_base_ms": "fast"})
    with pytest.raises(UserError, match="cannot find"):
        load_profile("no-such-profile")
    f = tmp_path / "p.yaml"
    f.write_text("step_base_ms: 3\n")
    assert load_profile(str(f)).step_base_ms == 3


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_sessions_replay_causally_and_concurrency_counts_sessions(tmp_path):
    rows = []
    for _turn in range(3):
        for user in range(4):
            rows.append({"text": "x" * 40, "session_id": f"u{user}"})
    path = _write(tmp_path / "s.jsonl", rows)
    prof = fast_profile(step_base_ms=5.0)
    turns = load_turns(path, prof)
    res = simulate(turns, prof, 0.0, concurrency=2, request_count=12,
                   policy=OutputPolicy(4, 4, True))
    by = {}
    for r in res.records:
        by.setdefault(r.conversation_id, []).append(r)
    assert sorted(by) == ["u0", "u1", "u2", "u3"]
    for recs in by.values():
        recs.sort(key=lambda r: r.start_ns)
        assert [r.turn_index for r in recs] == [0, 0, 0] or len(recs) == 3
        for prev, nxt in zip(recs, recs[1:]):
            assert nxt.start_ns >= prev.end_ns  # next turn only after the previous completes
    # never more than 2 requests in flight
    events = sorted([(r.start_ns, 1) for r in res.records] + [(r.end_ns, -1) for r in res.records],
                    key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak == 2
    # sessions start in order of first appearance: u0, u1 first
    first = sorted(res.records, key=lambda r: r.start_ns)[:2]
    assert {r.conversation_id for r in first} == {"u0", "u1"}


def test_warmup_then_profiling_and_request_count_wraps(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"text": f"row {i}"} for i in range(5)])
    prof = fast_profile()
    res = simulate(load_turns(path, prof), prof, 0.0, concurrency=3, request_count=8,
                   warmup_count=2, policy=OutputPolicy(3, 0, True))
    warm = [r for r in res.records if r.phase == "warmup"]
    prof_recs = [r for r in res.records if r.phase == "profiling"]
    assert len(warm) == 2 and len(prof_recs) == 8
    assert min(r.start_ns for r in prof_recs) >= max(r.end_ns for r in warm)
    assert all(r.output_tokens == 3 for r in res.records)


def test_virtual_cache_counts_match_analysis_lru(tmp_path):
    """Hits per request of a single-tier LRU registered at scheduling equal the exact byte-LRU
    prediction over dispatch order."""
    from mmdatagen.analysis.lru import lru_hits

    rnd = random.Random(3)
    pool = [png_url((i, 2 * i, 3), (64 + 32 * (i % 3), 64)) for i in range(12)]
    order = [rnd.randrange(12) for _ in range(80)]
    path = _write(tmp_path / "p.jsonl", [{"text": "hi", "image": pool[i]} for i in order])
    prof = fast_profile(cache="dynamo-encode", register="schedule")
    turns = load_turns(path, prof)
    keys = [t.images[0].key for t in turns]
    sizes = [t.images[0].nbytes for t in turns]
    cap = 4 * max(sizes) + 1000  # four entries: forces evictions
    res = simulate(turns, prof, cap / 2**30, concurrency=4, request_count=80)
    expect = lru_hits(keys, sizes, res.engine.cache.capacity)
    got = [r.image_hits for r in sorted(res.records, key=lambda r: int(r.x_request_id[4:]))]
    assert got == [int(x) for x in expect]
    assert res.engine.cache.evictions > 0


def test_key_modes_follow_the_engines():
    import base64
    import io

    from PIL import Image

    from mmdatagen.sim.protocol import ImageResolver
    from mmdatagen.vlm import get_model

    def png(level: int) -> str:
        buf = io.BytesIO()
        Image.new("RGB", (300, 200), (9, 99, 199)).save(buf, "PNG", compress_level=level)
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    a, b = png(0), png(9)
    assert a != b
    model = get_model("qwen3-vl-30b-a3b")

    def keys(mode: str, ua=None, ub=None) -> tuple[str, str]:
        r = ImageResolver(model, fast_profile(key_mode=mode))
        return r.resolve(a, ua).key, r.resolve(b, ub).key

    ka, kb = keys("bytes")
    assert ka != kb                       # vLLM: re-encoded picture misses
    ka, kb = keys("pixels")
    assert ka == kb                       # Dynamo aggregated: same pixels hit
    ka, kb = keys("reference")
    assert ka != kb
    ka, kb = keys("uuid", "same", "same")
    assert ka == kb                       # a client uuid replaces the content hash
    im = ImageResolver(model, fast_profile()).resolve(a, None)
    assert (im.tokens, im.prompt_tokens) == (model.image_tokens(300, 200),
                                             model.image_tokens(300, 200) + 2)
    assert im.nbytes == model.entry_bytes(300, 200)


def test_async_encoder_delays_only_the_missing_request(tmp_path):
    prof = fast_profile(step_base_ms=10.0, per_encoder_image_ms=25.0, encoder_async_fraction=1.0)
    eng = Engine(prof, 1.0)
    hit_first = SimRequest(0, 10, [], 3)
    eng.add(hit_first)
    assert eng.begin_step(0.0) == 10.0
    eng.end_step(10.0)
    missing = SimRequest(1, 10, [_img("z")], 2)
    eng.add(missing)
    # the encoder runs beside the step: no encoder cost in the step, no prefill yet
    assert eng.begin_step(10.0) == 10.0
    eng.end_step(20.0)
    assert missing.prefilled == 0 and missing.enc_ready == 35.0
    assert eng.next_wake(20.0) == 35.0
    eng.begin_step(20.0)
    eng.end_step(30.0)                   # hit_first finishes; missing still blocked
    assert hit_first.done and missing.emitted == 0
    assert eng.begin_step(30.0) is None  # only a blocked request left: nothing to run now
    assert eng.begin_step(35.0) == 10.0
    eng.end_step(45.0)
    assert missing.first_token_t == 45.0
    # the virtual driver jumps over blocked-only periods
    path = tmp_path / "one.jsonl"
    path.write_bytes(orjson.dumps({"text": "x", "image": png_url()}) + b"\n")
    res = simulate(load_turns(path, prof), prof, 1.0, 1, 1, policy=OutputPolicy(2, 2, True))
    assert res.records[0].first_token_ns == 35_000_000


def test_multi_turn_requests_carry_history(tmp_path):
    from mmdatagen.sim.virtual import reply_tokens

    img_a, img_b = png_url((1, 1, 1)), png_url((2, 2, 2))
    row = {"session_id": "s", "turns": [{"text": "a" * 40, "image": img_a},
                                        {"text": "b" * 40, "image": img_b}]}
    path = _write(tmp_path / "m.jsonl", [row])
    prof = fast_profile()
    turns = load_turns(path, prof)
    assert [len(t.images) for t in turns] == [1, 2]
    assert [t.text_tokens for t in turns] == [10, 20]
    res = simulate(turns, prof, 1.0, concurrency=1, request_count=2,
                   policy=OutputPolicy(5, 5, True))
    second = max(res.records, key=lambda r: r.start_ns)
    # the earlier image is re-sent: served by vLLM's encoder cache in front of Dynamo's
    assert (second.image_hits, second.image_misses) == (0, 1)
    assert res.engine.cache.counters()["encoder_hits"] == 1
    assert reply_tokens(5, 4.0) == 8  # " This is a simulated response" = 29 bytes
    assert res.engine.completed == 2


def test_one_pass_completes_every_session_and_wrap_cycles(tmp_path):
    rows = [{"text": "t", "session_id": f"s{i % 3}"} for i in range(9)]
    path = _write(tmp_path / "w.jsonl", rows)
    prof = fast_profile()
    turns = load_turns(path, prof)
    one = simulate(turns, prof, 0.0, 2, 9, policy=OutputPolicy(2, 2, True), wrap=False)
    assert sorted(r.conversation_id for r in one.records) == ["s0"] * 3 + ["s1"] * 3 + ["s2"] * 3
    more = simulate(turns, prof, 0.0, 2, 12, policy=OutputPolicy(2, 2, True))
    assert len(more.records) == 12 and any("#1" in r.conversation_id for r in more.records)
    zero = simulate(turns, load_profile("zero-delay"), 0.0, 2, 9, wrap=False)
    assert len(zero.records) == 9 and all(r.end_ns == 0 for r in zero.records)


def test_request_rate_paces_profiling_starts(tmp_path):
    path = _write(tmp_path / "r.jsonl", [{"text": f"row {i}"} for i in range(20)])
    prof = fast_profile(step_base_ms=2.0)
    turns = load_turns(path, prof)
    res = simulate(turns, prof, 0.0, 64, 20, warmup_count=2, policy=OutputPolicy(3, 3, True),
                   request_rate=50.0, arrival="constant")
    prof_starts = sorted(r.start_ns for r in res.records if r.phase == "profiling")
    gaps = {round((b - a) / 1e6, 6) for a, b in zip(prof_starts, prof_starts[1:])}
    assert gaps == {20.0} and len(prof_starts) == 20
    # capped by concurrency 1: a request starts at its slot or when the previous one ends
    slow = simulate(turns, fast_profile(step_base_ms=30.0), 0.0, 1, 5,
                    policy=OutputPolicy(2, 2, True), request_rate=1000.0, arrival="constant")
    recs = sorted(slow.records, key=lambda r: r.start_ns)
    assert all(b.start_ns == a.end_ns for a, b in zip(recs, recs[1:]))
    poisson = simulate(turns, prof, 0.0, 64, 20, policy=OutputPolicy(3, 3, True),
                       request_rate=50.0, seed=1)
    starts = sorted(r.start_ns for r in poisson.records)
    assert len(set(b - a for a, b in zip(starts, starts[1:]))) > 5
