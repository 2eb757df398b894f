"""``bench --reset-cache``: a second run on one server starts cold again (as its prediction
assumes), the simulator scopes each reset endpoint as vLLM does, and a server without any
says so."""
from __future__ import annotations

import asyncio

import orjson
from sim_helpers import MODEL, fast_profile, png_url, running

from mmdatagen.loadgen.run import _run_async


def _dataset(path):
    urls = [png_url((i, 9, 9), (64, 48)) for i in range(4)]
    path.write_bytes(b"".join(orjson.dumps({"text": f"q{i}", "image": urls[i % 4]}) + b"\n"
                              for i in range(12)))
    return path


def _cfg(path, url, out, reset):
    from loadgen_helpers import make_run

    return make_run(input_file=path, model=MODEL, url=url, concurrency=1, streaming=True,
                    output_dir=out, quiet=True, extra_inputs={"max_tokens": 2},
                    cache="dynamo-encode", cache_gb=1.0, reset_cache=reset)


def test_a_reset_run_starts_cold_and_matches_its_prediction(tmp_path):
    data = _dataset(tmp_path / "d.jsonl")

    async def go():
        prof = fast_profile().for_cache("dynamo-encode")
        async with running(prof, 1.0) as (url, sim, _):
            first = await _run_async(_cfg(data, url, tmp_path / "a", False), url)
            warm = await _run_async(_cfg(data, url, tmp_path / "b", False), url)
            cold = await _run_async(_cfg(data, url, tmp_path / "c", True), url)
            return first, warm, cold
    first, warm, cold = asyncio.run(go())
    hits = [r.export["image_cache"]["measured"]["hits"] for r in (first, warm, cold)]
    assert hits == [8, 12, 8]  # the second run found the first run's entries; the third not
    pred = cold.export["image_cache"]["predicted"]
    assert pred["hits"] == 8
    reset = cold.export["run_info"]["cache_reset"]
    assert "/mmdatagen/reset_cache" in reset["reset"]
    assert "cache_reset" not in warm.export["run_info"]


def test_reset_endpoints_are_scoped_as_vllm_scopes_them():
    """The encoder-cache reset clears only the front of Dynamo's two tiers; the simulator's
    own reset clears both; vLLM's processor-cache reset clears a processor cache."""
    import aiohttp

    from mmdatagen.caches import TieredCache

    async def go():
        async with running(fast_profile(encoder_budget=4000), 1.0) as (url, sim, sess):
            cache = sim.engine.cache
            assert isinstance(cache, TieredCache)
            body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": png_url()}}]}]}
            async with sess.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
            sizes = [len(cache.front), len(cache.back)]
            async with sess.post(url + "/reset_encoder_cache") as r:
                assert r.status == 200
            after_front = [len(cache.front), len(cache.back)]
            async with sess.post(url + "/mmdatagen/reset_cache") as r:
                assert r.status == 200
            after_all = [len(cache.front), len(cache.back)]
            async with sess.post(url + "/reset_prefix_cache") as r:
                assert (await r.json()) == {"success": True}
        async with running(fast_profile().for_cache("vllm-processor"), 1.0) as (url, sim, sess):
            async with sess.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
            before = len(sim.engine.cache)
            async with sess.post(url + "/reset_mm_cache") as r:
                assert r.status == 200
            return sizes, after_front, after_all, before, len(sim.engine.cache)
    sizes, after_front, after_all, before, after = asyncio.run(go())
    assert sizes == [1, 1] and after_front == [0, 1] and after_all == [0, 0]
    assert (before, after) == (1, 0)
    assert aiohttp  # the client the loader resets with


def test_a_server_without_reset_endpoints_is_named(tmp_path, capsys):
    from loadgen_helpers import Stub, bench_config, write_jsonl

    from mmdatagen.loadgen.run import run_bench

    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "r"}] * 2)
    with Stub() as stub:
        res = run_bench(bench_config(path, stub.url, tmp_path / "o", reset_cache=True))
    reset = res.export["run_info"]["cache_reset"]
    assert reset["reset"] == [] and set(reset["endpoints"]) >= {"/reset_mm_cache"}
    err = capsys.readouterr().err
    assert "warning: --reset-cache: the server exposes no cache-reset endpoint" in err


def test_a_server_that_does_not_answer_is_not_said_to_lack_the_endpoints():
    import socket

    from mmdatagen.loadgen.reset import reset_server_caches

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reset = asyncio.run(reset_server_caches(f"http://127.0.0.1:{port}", timeout=5))
    assert reset["reset"] == []
    assert reset["note"].startswith("the server did not answer the cache-reset requests (")
    assert "no cache was reset" in reset["note"] and "exposes no" not in reset["note"]
