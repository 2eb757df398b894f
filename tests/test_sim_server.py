"""The simulator over real loopback HTTP: streaming, non-streaming, endpoints, every error path."""
from __future__ import annotations

import orjson
import pytest
from sim_helpers import MODEL, chat, fast_profile, png_url, run, running


async def _sse(resp) -> list[bytes]:
    raw = await resp.read()
    return [e for e in raw.split(b"\n\n") if e]


def test_streamed_chat_chunks_usage_and_headers():
    async def go():
        async with running() as (url, sim, sess):
            body = chat([{"type": "text", "text": "x" * 400},
                         {"type": "image_url", "image_url": {"url": png_url()}}],
                        stream=True, stream_options={"include_usage": True},
                        max_tokens=5, min_tokens=5, ignore_eos=True)
            async with sess.post(url + "/v1/chat/completions", json=body,
                                 headers={"X-Request-ID": "abc"}) as resp:
                assert resp.status == 200
                assert resp.content_type == "text/event-stream"
                h = resp.headers
                assert (h["x-mmdatagen-image-hits"], h["x-mmdatagen-image-misses"]) == ("0", "1")
                assert int(h["x-mmdatagen-server-ttft-ns"]) > 0
                assert h["x-request-id"] == "abc"
                events = await _sse(resp)
            assert events[-1] == b"data: [DONE]"
            docs = [orjson.loads(e[6:]) for e in events[:-1]]
            content = [d for d in docs if d["choices"]]
            assert len(content) == 5
            assert content[0]["choices"][0]["delta"]["role"] == "assistant"
            assert [d["choices"][0]["finish_reason"] for d in content] == [None] * 4 + ["length"]
            assert all(d["object"] == "chat.completion.chunk" and d["model"] == MODEL for d in docs)
            assert len({d["id"] for d in docs}) == 1
            usage = docs[-1]["usage"]
            # 400 bytes / 4 = 100 text tokens; 640x480 -> 300 image tokens + 2 markers
            assert usage == {"prompt_tokens": 402, "completion_tokens": 5, "total_tokens": 407}
            assert docs[-1]["choices"] == []
    run(go())


def test_stream_without_usage_and_min_max_tokens():
    async def go():
        async with running() as (url, sim, sess):
            body = chat("hello", stream=True, max_completion_tokens=3)
            async with sess.post(url + "/v1/chat/completions", json=body) as resp:
                events = await _sse(resp)
            docs = [orjson.loads(e[6:]) for e in events[:-1]]
            assert len(docs) == 3 and all("usage" not in d for d in docs)
            # without ignore_eos the natural length (7) caps; min_tokens raises it
            body = chat("hello", stream=False, max_tokens=50, min_tokens=9)
            async with sess.post(url + "/v1/chat/completions", json=body) as resp:
                doc = await resp.json()
            assert doc["usage"]["completion_tokens"] == 9
            assert doc["choices"][0]["finish_reason"] == "stop"
            body = chat("hello", max_tokens=50)
            async with sess.post(url + "/v1/chat/completions", json=body) as resp:
                doc = await resp.json()
            assert doc["usage"]["completion_tokens"] == 7
    run(go())


def test_non_streaming_and_completions_endpoint():
    async def go():
        async with running() as (url, sim, sess):
            body = chat([{"type": "text", "text": "abcd" * 10}], max_tokens=4, ignore_eos=True)
            async with sess.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                assert resp.headers["x-mmdatagen-image-misses"] == "0"
                doc = await resp.json()
            assert doc["object"] == "chat.completion"
            assert doc["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
            assert "performance" in doc["choices"][0]["message"]["content"] or \
                doc["choices"][0]["message"]["content"].startswith(" This is a simulated")
            body = {"model": MODEL, "prompt": "abcd" * 3, "max_tokens": 2, "stream": True,
                    "ignore_eos": True, "stream_options": {"include_usage": True}}
            async with sess.post(url + "/v1/completions", json=body) as resp:
                events = await _sse(resp)
            docs = [orjson.loads(e[6:]) for e in events[:-1]]
            assert [d["choices"][0]["text"] for d in docs[:2]] == [" This", " is"]
            assert docs[-1]["usage"]["prompt_tokens"] == 3
    run(go())


def test_models_health_metrics():
    async def go():
        async with running() as (url, sim, sess):
            async with sess.get(url + "/v1/models") as resp:
                doc = await resp.json()
            assert doc["data"][0]["id"] == MODEL
            assert "not a language model" in doc["data"][0]["description"]
            async with sess.get(url + "/health") as resp:
                assert resp.status == 200
            async with sess.get(url + "/metrics") as resp:
                text = await resp.text()
            for name in ("embedding_cache_queries_total", "embedding_cache_hits_total",
                         "embedding_cache_misses_total", "embedding_cache_evictions_total",
                         "embedding_cache_bytes", "embedding_cache_entries", "requests_total",
                         "engine_emission_late_seconds_total", "engine_step_configured_seconds_total"):
                assert f"\nmmdatagen_sim_{name} " in "\n" + text
    run(go())


def _png_header(w: int, h: int) -> str:
    """A PNG whose header claims w x h (no pixel data): sized without decoding."""
    import base64
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    raw = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\x00")) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def _img(url: str) -> bytes:
    return orjson.dumps(chat([{"type": "image_url", "image_url": {"url": url}}]))


BAD = [
    (_img(_png_header(30000, 30000)), 400, "DecompressionBomb"),
    (_img(_png_header(20000, 50)), 400, "aspect ratio"),
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (orjson.dumps({"messages": [{"role": "user", "content": "x"}]}), 400, "model"),
    (orjson.dumps({"model": MODEL}), 400, "messages"),
    (orjson.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}), 404, "nope"),
    (orjson.dumps(chat([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}])),
     400, "base64"),
    (orjson.dumps(chat([{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}])),
     400, "unsupported or corrupt"),
    (orjson.dumps(chat([{"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGVsbG8="}}])),
     400, "media type"),
    (orjson.dumps(chat([{"type": "image_url", "image_url": {"url": "/etc/passwd"}}])), 400, "URL"),
    (orjson.dumps(chat([{"type": "input_audio", "input_audio": {}}])), 400, "input_audio parts need"),
    (orjson.dumps(chat([{"type": "text"}])), 400, "text"),
    (orjson.dumps(chat([{"type": "image_url", "image_url": {"url": "", "detail": "x"}}])), 400, "uuid"),
    (orjson.dumps(chat("x", max_tokens=0)), 400, "max_tokens"),
    (orjson.dumps(chat("x", max_tokens="5")), 400, "max_tokens"),
    (orjson.dumps(chat("x", max_tokens=2, min_tokens=5)), 400, "min_tokens"),
    (orjson.dumps(chat("x", stream="yes")), 400, "stream"),
    (orjson.dumps(chat("x", n=2)), 400, "n = 1"),
    (orjson.dumps(chat("x", max_tokens=10**9)), 400, "context length"),
    (orjson.dumps({"model": MODEL, "messages": ["hi"]}), 400, "role"),
    (orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": 5}]}), 400, "content"),
]


@pytest.mark.parametrize("raw,status,needle", BAD)
def test_error_paths_are_openai_errors(raw, status, needle):
    async def go():
        async with running() as (url, sim, sess):
            async with sess.post(url + "/v1/chat/completions", data=raw,
                                 headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == status
                doc = await resp.json()
            assert needle in doc["error"]["message"]
            assert {"message", "type", "code"} <= set(doc["error"])
            # the server is still healthy afterwards
            async with sess.post(url + "/v1/chat/completions", json=chat("ok")) as resp:
                assert resp.status == 200
    run(go())


def test_completions_bad_prompt_and_unsupported_format():
    async def go():
        async with running() as (url, sim, sess):
            async with sess.post(url + "/v1/completions", json={"model": MODEL, "prompt": 5}) as resp:
                assert resp.status == 400
            gif = png_url(fmt="GIF")  # decodable by PIL: accepted
            async with sess.post(url + "/v1/chat/completions",
                                 json=chat([{"type": "image_url", "image_url": {"url": gif}}])) as r:
                assert r.status == 200
            svg = "data:image/svg+xml;base64,PHN2Zz48L3N2Zz4="
            async with sess.post(url + "/v1/chat/completions",
                                 json=chat([{"type": "image_url", "image_url": {"url": svg}}])) as r:
                assert r.status == 400
    run(go())


def test_body_limit_413_and_api_key_401():
    async def go():
        prof = fast_profile(max_body_mb=0.01)
        async with running(prof, api_key="sekrit") as (url, sim, sess):
            async with sess.post(url + "/v1/chat/completions", json=chat("x")) as resp:
                assert resp.status == 401
                assert (await resp.json())["error"]["type"] == "authentication_error"
            auth = {"Authorization": "Bearer sekrit"}
            async with sess.get(url + "/v1/models", headers=auth) as resp:
                assert resp.status == 200
            async with sess.post(url + "/v1/chat/completions", json=chat("x" * 20000),
                                 headers=auth) as resp:
                assert resp.status == 413
                assert "exceeds" in (await resp.json())["error"]["message"]
            async with sess.post(url + "/v1/chat/completions", json=chat("x"), headers=auth) as resp:
                assert resp.status == 200
            async with sess.get(url + "/health") as resp:  # health needs no key
                assert resp.status == 200
    run(go())


def test_http_url_and_uuid_keys():
    # the repeat is one key: served (by vLLM's encoder cache in front of Dynamo's, so it is
    # no miss, and no hit of Dynamo's either)
    async def go():
        async with running() as (url, sim, sess):
            part = {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}
            for expect in ("1", "0"):
                async with sess.post(url + "/v1/chat/completions", json=chat([part])) as resp:
                    assert resp.headers["x-mmdatagen-image-misses"] == expect
                    assert resp.headers["x-mmdatagen-image-hits"] == "0"
                    # default size 640x480 -> 302 prompt tokens
                    assert (await resp.json())["usage"]["prompt_tokens"] == 302
            cache_only = {"type": "image_url", "image_url": {"url": ""}, "uuid": "u1"}
            for expect in ("1", "0"):
                async with sess.post(url + "/v1/chat/completions", json=chat([cache_only])) as r:
                    assert r.headers["x-mmdatagen-image-misses"] == expect
    run(go())


def test_http_cache_counters_match_exact_lru():
    """Sequential requests through the server: headers and /metrics equal an independent
    replay of Dynamo's two tiers (vLLM's encoder cache in front of the connector's LRU)."""
    import random

    from analysis_oracle import replay_two_tier

    from mmdatagen.vlm import get_model

    rnd = random.Random(5)
    sizes_px = [(320 + 64 * (i % 4), 240) for i in range(10)]
    urls = [png_url((i, 0, 0), sizes_px[i]) for i in range(10)]
    order = [rnd.randrange(10) for _ in range(40)]
    model = get_model("qwen3-vl-30b-a3b")
    tokens = {i: model.image_tokens(*sizes_px[i]) for i in range(10)}
    nbytes = {i: model.entry_bytes(*sizes_px[i]) for i in range(10)}
    cap, budget = 3 * max(nbytes.values()), 2 * max(tokens.values())
    want = replay_two_tier([[i] for i in order], tokens, nbytes, budget, cap)
    assert want["hits"] and want["encoder_hits"]  # both tiers serve some repeats

    async def go():
        async with running(fast_profile(encoder_budget=budget),
                           cache_gb=cap / 2**30) as (url, sim, sess):
            got = []
            for i in order:
                body = chat([{"type": "image_url", "image_url": {"url": urls[i]}}], max_tokens=1)
                async with sess.post(url + "/v1/chat/completions", json=body) as resp:
                    got.append(int(resp.headers["x-mmdatagen-image-hits"]))
            async with sess.get(url + "/metrics") as resp:
                text = await resp.text()
            return got, text

    got, text = run(go())
    assert got == want["per_row"]
    assert f"mmdatagen_sim_embedding_cache_hits_total {want['hits']}\n" in text
    assert f"mmdatagen_sim_embedding_cache_misses_total {want['misses']}\n" in text
    assert f"mmdatagen_sim_embedding_cache_evictions_total {want['evictions']}\n" in text
    assert f"mmdatagen_sim_encoder_cache_hits_total {want['encoder_hits']}\n" in text
    for name in ("hits", "misses", "evictions"):  # and under Dynamo's own counter names
        assert f"dynamo_component_embedding_cache_{name}_total" in text


def test_time_scale_stretches_server_time():
    """Deterministic lower bounds only: sleeps never end early."""
    async def go():
        prof = fast_profile(step_base_ms=5.0)
        out = {}
        for scale in (1.0, 4.0):
            async with running(prof, time_scale=scale) as (url, sim, sess):
                body = chat("hi", max_tokens=3, ignore_eos=True)
                async with sess.post(url + "/v1/chat/completions", json=body) as resp:
                    out[scale] = int(resp.headers["x-mmdatagen-server-ttft-ns"])
                    await resp.read()
                assert sim.driver.configured_s == pytest.approx(3 * 5.0 * scale / 1000)
                async with sess.get(url + "/metrics") as resp:
                    assert f'time_scale="{scale}"' in await resp.text()
        assert out[4.0] >= 20_000_000  # one 5 ms step x 4
    run(go())
