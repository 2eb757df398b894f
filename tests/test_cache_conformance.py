"""The loader's predicted hits equal the simulator's measured hits, exactly, for every cache
target: random workloads (multi-image rows, repeats inside a row, causal sessions, uuids),
concurrency 1 to 64, capacities at and around each cliff."""
from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loadgen_helpers import make_run
from sim_helpers import MODEL, fast_profile, running

from mmdatagen.caches import get_target, target_names
from mmdatagen.caches.entries import entry_size
from mmdatagen.io.imageref import ImageIdentifier
from mmdatagen.loadgen.run import _run_async
from mmdatagen.vlm import get_model

SIZES = ((64, 48), (96, 96), (200, 120), (640, 480))


def _urls(n: int, seed: int) -> list[str]:
    """``n`` distinct PNG data URLs of the sizes above: a random colour and a row of random
    pixels each, so every key (bytes, pixels, reference) tells them apart. Sizes, not contents,
    make the entries and the cliffs; noise made a 640x480 picture 1.2 MB of base64 (15 MB
    datasets, sent and parsed by every example)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        pixels = np.empty((h, w, 3), dtype=np.uint8)
        pixels[:] = rng.integers(0, 256, 3, dtype=np.uint8)
        pixels[0] = rng.integers(0, 256, (w, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "PNG")
        out.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    assert len(set(out)) == n
    return out


@st.composite
def workloads(draw):
    distinct = draw(st.integers(2, 9))
    rows = draw(st.lists(st.lists(st.integers(0, distinct - 1), min_size=1, max_size=3),
                         min_size=4, max_size=28))
    sessions = draw(st.sampled_from([None, 2, 5]))
    uuids = draw(st.booleans())
    target = draw(st.sampled_from(target_names()))
    concurrency = draw(st.sampled_from([1, 2, 8, 64]))
    fraction = draw(st.sampled_from([0.0, 0.2, 0.45, 0.7, 0.99, 1.0, 1.3]))
    front = draw(st.sampled_from([1, 2, 4]))  # a two-tier target's front: largest items held
    return distinct, rows, sessions, uuids, target, concurrency, fraction, front


def _capacity(target, urls, fraction: float) -> float:
    """A capacity, in the target's unit, at ``fraction`` of all distinct entries together."""
    model = get_model(MODEL)
    ident = ImageIdentifier("bytes")
    total = sum(entry_size(target, model, ident(u).width, ident(u).height) for u in urls)
    if target.entry == "embedding-set":
        total *= 2
    scale = {"GiB": 1 << 30, "MiB": 1 << 20, "tokens": 1}[target.unit]
    return total * fraction / scale


def _write(path, urls, rows, sessions, uuids) -> None:
    lines = []
    for i, row in enumerate(rows):
        obj = {"text": f"row {i} " * 5, "images": [urls[j] for j in row]}
        if uuids and i % 2:
            obj["image_uuids"] = [f"img-{j}" for j in row]
        if sessions:
            obj["session_id"] = f"user-{i % sessions}"
        lines.append(orjson.dumps(obj))
    path.write_bytes(b"\n".join(lines) + b"\n")


def _front(urls, items: int) -> int:
    """A front budget (tokens) holding ``items`` of the largest image."""
    model = get_model(MODEL)
    ident = ImageIdentifier("bytes")
    return items * max(model.image_tokens(ident(u).width, ident(u).height) for u in urls)


async def _bench(tmp_path, target, capacity, concurrency, front=None):
    prof = fast_profile(max_running=16, token_budget=4096,
                        encoder_budget=front).for_cache(target.name)
    async with running(prof, capacity) as (url, sim, _):
        cfg = make_run(input_file=tmp_path / "d.jsonl", model=MODEL, url=url,
                       concurrency=concurrency, streaming=True, output_dir=tmp_path / "o",
                       quiet=True, extra_inputs={"max_tokens": 3}, cache=target.name,
                       cache_gb=capacity, encoder_budget=front)
        res = await _run_async(cfg, url)
        return res, sim.engine.cache.counters()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(workloads())
def test_predicted_equals_measured_for_every_target(tmp_path_factory, work):
    distinct, rows, sessions, uuids, name, concurrency, fraction, front_items = work
    tmp_path = tmp_path_factory.mktemp("conf")
    urls = _urls(distinct, seed=len(rows))
    _write(tmp_path / "d.jsonl", urls, rows, sessions, uuids)
    target = get_target(name)
    capacity = _capacity(target, urls, fraction)
    front = _front(urls, front_items) if target.front else None
    res, counters = asyncio.run(_bench(tmp_path, target, capacity, concurrency, front))
    cache = res.export["image_cache"]
    measured, predicted = cache["measured"], cache["predicted"]
    refs = sum(len(r) for r in rows)
    # a two-tier target counts its own lookups only: the front's hits never reach it
    refs -= counters.get("encoder_hits", 0)
    assert measured["hits"] + measured["misses"] == refs
    assert predicted["references"] == refs, predicted
    assert predicted["hits"] == measured["hits"], (predicted, measured)
    assert predicted["order"].startswith("the server's cache timeline")
    per_request = {r.x_request_id: (r.image_hits, r.predicted_hits) for r in res.records}
    assert all(h == p for h, p in per_request.values())
    if target.entry != "embedding-set":
        assert counters["hits"] == measured["hits"]


def test_vllm_counter_names_and_client_order_prediction(tmp_path):
    """vLLM's processor cache in the simulator: counters under vLLM's names; a loader that
    cannot see the timeline (a real engine) predicts from its own send order, which at
    concurrency 1 is the server's order."""
    urls = _urls(6, seed=3)
    rows = [[0, 1], [2], [0, 3], [4, 5, 1], [2, 0], [3, 3], [5]]
    _write(tmp_path / "d.jsonl", urls, rows, None, False)
    target = get_target("vllm-processor")
    capacity = _capacity(target, urls, 0.45)

    async def go():
        prof = fast_profile().for_cache(target.name)
        async with running(prof, capacity) as (url, sim, sess):
            cfg = make_run(input_file=tmp_path / "d.jsonl", model=MODEL, url=url,
                           concurrency=1, streaming=True, output_dir=tmp_path / "o",
                           quiet=True, extra_inputs={"max_tokens": 3}, cache=target.name,
                           cache_gb=capacity)
            res = await _run_async(cfg, url)
            async with sess.get(url + "/metrics") as r:
                text = await r.text()
            from mmdatagen.loadgen.predict import ImageTracker

            return res, text, ImageTracker
    res, text, _ = asyncio.run(go())
    assert 'vllm:mm_cache_queries_total{model_name="' in text
    hits = int(next(ln for ln in text.splitlines()
                    if ln.startswith("vllm:mm_cache_hits_total")).rsplit(" ", 1)[1])
    assert hits == res.export["image_cache"]["measured"]["hits"] > 0


@pytest.mark.parametrize("name", target_names())
def test_every_target_cites_its_engine_sources(name):
    t = get_target(name)
    assert t.sources and all(" " in s and "/" in s for s in t.sources)
    assert t.capacity(1.0) > 0 and t.unit in ("GiB", "MiB", "tokens")


@pytest.mark.parametrize("name", ["vllm-processor", "vllm-encoder", "dynamo-embedding",
                                  "dynamo-connector"])
def test_mixed_image_video_audio_predicted_equals_measured(tmp_path, name):
    """Videos and audios share the cache with the images: the loader counts every item the
    simulator counts, keyed and sized by the same services."""
    import subprocess
    import sys

    data = tmp_path / "mixed.jsonl"
    subprocess.run([sys.executable, "-m", "mmdatagen", "pool", "-n", "16", "--pool-size", "4",
                    "--reuse", "uniform", "--image-size", "64x48", "--videos-per-request", "1",
                    "--video-pool-size", "3", "--video-size", "64x48", "--video-frames", "4",
                    "--audios-per-request", "1", "--audio-pool-size", "2",
                    "--audio-duration", "0.5", "--delivery", "data-url", "--text-tokens", "8",
                    "-o", str(data), "-q"], check=True, capture_output=True, timeout=300)
    target = get_target(name)
    capacity = {"GiB": 0.0004, "tokens": 200.0}.get(target.unit, 1.0)

    front = 200 if target.front else None  # the largest item or two: Dynamo's tier sees lookups

    async def go():
        prof = fast_profile(encoder_budget=front).for_cache(name)
        async with running(prof, capacity) as (url, sim, _):
            cfg = make_run(input_file=data, model=MODEL, url=url, concurrency=4,
                           streaming=True, output_dir=tmp_path / "o", quiet=True,
                           extra_inputs={"max_tokens": 3}, cache=name, cache_gb=capacity,
                           encoder_budget=front)
            return await _run_async(cfg, url), sim.engine.cache.counters()
    res, counters = asyncio.run(go())
    cache = res.export["image_cache"]
    refs = 16 * 3 - counters.get("encoder_hits", 0)  # the front's hits never reach the target
    assert refs > 16 and (not target.front or counters["encoder_hits"] > 0)
    assert cache["measured"]["hits"] + cache["measured"]["misses"] == refs
    assert cache["predicted"]["references"] == refs
    assert cache["predicted"]["hits"] == cache["measured"]["hits"]
    assert 0 < cache["measured"]["hits"] < refs - 9  # evicting, and not trivially all-miss
