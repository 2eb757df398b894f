"""``analyze`` for Dynamo's two tiers (dynamo-embedding, dynamo-connector): vLLM's encoder cache
replayed once, the connector's curve over its misses; checked against the independent two-tier
replay (``analysis_oracle.replay_two_tier``) at every capacity, and against the shared cache
model (``caches.model.TieredCache``) with requests in flight."""
from __future__ import annotations

import json

import numpy as np
import pytest
from analysis_oracle import replay_two_tier
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.analysis.predict import Semantics, _dispatched, analyze
from mmdatagen.analysis.targets import Replay
from mmdatagen.analysis.tiers import front_flags
from mmdatagen.analysis.trace import Trace
from mmdatagen.caches import get_target, make_cache
from mmdatagen.caches.model import FreeableCache
from mmdatagen.errors import UserError
from mmdatagen.vlm import get_model

MODEL = get_model("qwen3-vl-30b-a3b")
BPT = MODEL.bytes_per_token
DIMS = [(64, 64), (128, 96), (256, 256), (640, 480)]  # 16, 48, 256, 300 tokens


@st.composite
def workloads(draw, max_rows=30):
    m = draw(st.integers(1, 10))
    dims = [draw(st.sampled_from(DIMS)) for _ in range(m)]
    rows = draw(st.lists(st.lists(st.integers(0, m - 1), min_size=0, max_size=4),
                         min_size=1, max_size=max_rows))
    lens = np.array([len(r) for r in rows], np.int64)
    trace = Trace(np.array([x for r in rows for x in r], np.int64),
                  np.repeat(np.arange(len(rows)), lens), len(rows),
                  np.array([d[0] for d in dims], np.int64), np.array([d[1] for d in dims],
                                                                     np.int64))
    return trace, rows


def _oracle(trace: Trace, rows, budget: int, capacity: int) -> dict:
    sizes, _ = trace.costs(MODEL, target=get_target("dynamo-embedding"))
    entry = {k: int(sizes[k]) for k in range(sizes.size)}
    tokens = {k: -(-v // BPT) for k, v in entry.items()}
    return replay_two_tier(rows, tokens, entry, budget, capacity)


def _whole(trace: Trace, rows, budget: int, capacity: int) -> int:
    """Requests with images every item of which one of the tiers served (``TieredCache``)."""
    sizes, _ = trace.costs(MODEL, target=get_target("dynamo-embedding"))
    cache = make_cache(get_target("dynamo-embedding"), capacity, front_tokens=budget,
                       bytes_per_token=BPT)
    whole = 0
    for rid, row in enumerate(rows):
        flags = cache.lookup(rid, [(k, int(sizes[k])) for k in row])
        whole += bool(row) and all(f or s for f, s in zip(flags, cache.last_front))
        cache.finish(rid)
    return whole


@settings(max_examples=200, deadline=None)
@given(workloads(), st.integers(1, 1200), st.data())
def test_every_capacity_equals_the_two_tier_replay(work, budget, data):
    """Hits, misses, evictions, encoder runs and the front's hits, at many connector sizes at
    once (asked capacities and the curve), equal the independent replay at each size."""
    trace, rows = work
    target = data.draw(st.sampled_from(["dynamo-embedding", "dynamo-connector"]))
    sizes, _ = trace.costs(MODEL, target=get_target(target))
    total = int(sizes[np.unique(trace.ids)].sum()) if trace.ids.size else 0
    caps = sorted(set(data.draw(st.lists(st.integers(0, total + BPT), min_size=1,
                                         max_size=12))))
    a = analyze(trace, MODEL, Semantics(target=target, encoder_budget=budget), caps)
    s = a.summary
    at = a.curve.at(caps)
    for k, (cap, row) in enumerate(zip(caps, s["capacities"])):
        want = _oracle(trace, rows, budget, cap)
        assert (row["hits"], row["misses"], row["evictions"], row["encoder_hits"]) == (
            want["hits"], want["misses"], want["evictions"], want["encoder_hits"]), cap
        assert row["encoder_runs"] == row["misses"] and at["hits"][k] == row["hits"]
        assert row["lookups"] == s["references"] == trace.ids.size - want["encoder_hits"]
        assert s["front"]["hits"] == want["encoder_hits"]
        if s["references"]:
            assert row["hit_rate"] == pytest.approx(want["hits"] / s["references"])
        whole = row["full_request_rate"] * max(s["requests_with_images"], 1)
        assert round(whole) == _whole(trace, rows, budget, cap), cap
        assert at["full_requests"][k] == round(whole), cap
    assert s["front"]["references"] == trace.ids.size
    assert s["front"]["budget_tokens"] == budget


@settings(max_examples=150, deadline=None)
@given(workloads(max_rows=20), st.integers(1, 900), st.integers(1, 4), st.data())
def test_in_flight_equals_the_tiered_cache_model(work, budget, in_flight, data):
    """Requests in flight (completions first-in first-out): the front releases a request's
    items at its completion; hits and front hits equal ``TieredCache`` over the same events."""
    trace, _ = work
    t = get_target("dynamo-embedding")
    sizes, _ = trace.costs(MODEL, target=t)
    total = int(sizes[np.unique(trace.ids)].sum()) if trace.ids.size else 0
    caps = sorted(set(data.draw(st.lists(st.integers(0, total + 1), min_size=1, max_size=6))))
    sem = Semantics(target=t.name, encoder_budget=budget, in_flight=in_flight, orders=1)
    s = analyze(trace, MODEL, sem, caps, want_curve=False).summary
    ordered, ev = _dispatched(trace, sem, None)
    replay = Replay(t, ordered, sizes, ev, front_tokens=budget, bytes_per_token=BPT)
    for cap, row in zip(caps, s["capacities"]):
        assert row["hits"] == int(replay.flags(cap).sum()), cap
        c = replay.counters
        assert (row["misses"], row["encoder_hits"]) == (c["misses"], c["encoder_hits"]), cap
        if in_flight == 1:
            assert row["evictions"] == c["evictions"], cap


@settings(max_examples=200, deadline=None)
@given(workloads(), st.integers(1, 900), st.integers(1, 5), st.booleans())
def test_front_kernel_equals_freeable_cache(work, budget, in_flight, compiled):
    """The compiled front pass and its plain-Python run equal ``caches.model.FreeableCache``."""
    from mmdatagen.analysis import concurrency, kernels

    trace, _ = work
    tokens = np.array([MODEL.image_tokens(int(w), int(h))
                       for w, h in zip(trace.widths, trace.heights)], np.int64)
    ev = concurrency.events(trace.num_rows, in_flight)
    old = kernels.PYTHON_MAX_REFS
    kernels.PYTHON_MAX_REFS = -1 if compiled else old
    try:
        served, counters = front_flags(trace, tokens, budget, ev)
    finally:
        kernels.PYTHON_MAX_REFS = old
    cache = FreeableCache(budget)
    starts = np.searchsorted(trace.ref_row, np.arange(trace.num_rows + 1))
    want = np.zeros(trace.ids.size, bool)
    for e in ev.tolist():
        if e < 0:
            cache.finish(~e)
            continue
        a, b = starts[e], starts[e + 1]
        want[a:b] = cache.lookup(e, [(int(x), int(tokens[x])) for x in trace.ids[a:b]])
    assert served.tolist() == want.tolist()
    assert (counters["hits"], counters["evictions"], counters["inserts"]) == (
        cache.hits, cache.evictions, cache.inserts)


def test_a_front_that_holds_the_repeats_leaves_the_connector_compulsory_misses():
    """Alternating two images: an encoder cache holding both serves every repeat, so Dynamo is
    asked twice (two misses); one holding a single image sends every reference to Dynamo."""
    trace = Trace(np.array([0, 1] * 5, np.int64), np.arange(10), 10,
                  np.array([640, 640]), np.array([480, 480]))
    both = analyze(trace, MODEL, Semantics(encoder_budget=600), [10 ** 9]).summary
    one = analyze(trace, MODEL, Semantics(encoder_budget=300), [10 ** 9]).summary
    assert (both["references"], both["front"]["hits"], both["best"]["hits"]) == (2, 8, 0)
    assert (one["references"], one["front"]["hits"], one["best"]["hits"]) == (10, 0, 8)
    assert one["capacities"][0]["evictions"] == 0 and one["capacities"][0]["misses"] == 2


def test_insert_and_oversize_overrides_and_budget_on_one_tier_are_refused():
    trace = Trace(np.array([0], np.int64), np.array([0]), 1, np.array([64]), np.array([64]))
    for sem in (Semantics(insert="completion"), Semantics(oversize="flush"),
                Semantics(target="vllm-processor", encoder_budget=100)):
        with pytest.raises(UserError):
            analyze(trace, MODEL, sem)


def test_cli_report_json_and_curve(run_cli, tmp_path):
    """The report names the front tier and the connector's counters; the JSON has them per
    capacity; the curve's hit rate is of the connector's lookups."""
    args = ("analyze", "--workload", "pool", "--pool-size", "50", "--num-requests", "400",
            "--image-size", "640x480", "--reuse", "uniform", "--encoder-budget", "3000",
            "--cache-gb", "0.002,1")
    doc = json.loads(run_cli(*args, "--json", "--curve", tmp_path / "c.csv").output)
    front = doc["front"]
    assert front["budget_tokens"] == 3000 and front["references"] == 400
    assert 0 < front["hits"] < 400 and doc["references"] == 400 - front["hits"]
    small, big = doc["capacities"]
    assert small["evictions"] > 0 and big["evictions"] == 0 and big["misses"] == 50
    assert small["lookups"] == doc["references"] and small["encoder_runs"] == small["misses"]
    text = run_cli(*args).output
    assert "vLLM's encoder cache" in text and "3,000 tokens" in text
    assert "evictions" in text and "lookups" in text
    rows = (tmp_path / "c.csv").read_text().splitlines()
    assert rows[0].startswith("capacity_bytes,") and "encoder_hits" in rows[0]
    last = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert float(last["hit_rate"]) == pytest.approx(doc["best"]["hit_rate"])
    assert int(last["hits"]) + int(last["misses"]) == doc["references"]
