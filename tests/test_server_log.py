"""``bench --server-log``: the order a server's log names the requests in is the order its cache
saw them, so the prediction replays it exactly, at any concurrency.

A loopback stand-in for vLLM's API server (``test_engine_faults.FakeVllm``) waits a random
moment per request (so arrivals leave the send order), then looks the request's images up in
its processor cache and logs "Received request chatcmpl-<X-Request-ID>" as vLLM does with
--enable-log-requests. With the log, bench's prediction equals the stand-in's hits and the band
has width 0; without it the band still holds them; a log that misses requests says so and
falls back.
"""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import orjson
from aiohttp import web
from loadgen_helpers import make_run, write_jsonl
from test_engine_faults import MODEL, FakeVllm, png

from mmdatagen.loadgen.run import run_bench


class LoggingVllm(FakeVllm):
    def __init__(self, entries: int, jitter_s: float, log: Path, skip: int = 0) -> None:
        super().__init__(entries, jitter_s)
        self.log, self.skip = log, skip
        self.log.write_text("INFO 11-25 05:00:00 [api_server.py] vLLM API server version 0.32\n")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        await asyncio.sleep(self.rng.random() * self.jitter_s)  # arrivals leave the send order
        parts = body["messages"][-1]["content"]
        items = [(p["uuid"], self.size) for p in parts if p["type"] == "image_url"]
        self.n += 1
        self.cache.lookup(self.n, items)
        if self.n > self.skip:
            with self.log.open("a") as fh:
                fh.write(f"INFO [logger.py:47] Received request chatcmpl-"
                         f"{request.headers['X-Request-ID']}: params: SamplingParams(n=1)\n")
        return web.json_response({"choices": [{"message": {"role": "assistant",
                                                            "content": "fine"}}],
                                  "usage": {"prompt_tokens": 9, "completion_tokens": 1}})


def data(path: Path, rows: int = 48) -> Path:
    rng = random.Random(5)
    out = []
    for r in range(rows):
        ids = [rng.randrange(10) for _ in range(rng.randint(1, 3))]
        out.append({"text": f"row {r}", "images": [png(i) for i in ids],
                    "image_uuids": [f"img-{i}" for i in ids]})
    return write_jsonl(path, out)


def run(tmp_path: Path, name: str, skip: int = 0, with_log: bool = True, rows: int = 48):
    entries, log = 3, tmp_path / f"{name}.log"
    with LoggingVllm(entries, 0.03, log, skip) as server:
        cfg = make_run(input_file=data(tmp_path / "d.jsonl", rows), url=server.url, model=MODEL,
                       output_dir=tmp_path / name, quiet=True, concurrency=8,
                       cache="vllm-processor", cache_gb=entries * server.size / (1 << 30),
                       metrics_interval=60.0, server_log=log if with_log else None)
        result = run_bench(cfg)
        return result.export["image_cache"]["predicted"], server.cache.hits, server.cache.queries


def test_the_server_log_order_replays_exactly(tmp_path):
    pred, hits, queries = run(tmp_path, "logged")
    assert pred["references"] == queries
    assert pred["order"] == "the server's log order (exact)"
    assert pred["hits"] == hits, pred
    assert pred["band"]["width"] == 0 and pred["band"]["measured_inside"] is True
    assert "note" not in pred


def test_without_the_log_the_band_holds_the_engine(tmp_path):
    # 24 rows: the band over 48 requests at concurrency 8 took 38 s of the fast suite
    pred, hits, _ = run(tmp_path, "unlogged", with_log=False, rows=24)
    band = pred["band"]
    assert pred["order"] != "the server's log order (exact)"
    assert band["low"] <= hits <= band["high"] and band["measured_inside"] is True
    assert band["width"] > 0  # a real band: the order is not known


def test_a_log_missing_requests_says_so_and_falls_back(tmp_path, monkeypatch):
    from mmdatagen.loadgen import predict

    # the stand-in logs a request before it answers, and five lines never come: bench waits
    # 0.5 s for them here, not the 5 s it gives a real server's late log lines
    monkeypatch.setattr(predict.read_server_order, "__defaults__", (0.5,))
    # 24 rows: the fallback's band over the first tokens' orders costs seconds, not 40
    pred, hits, _ = run(tmp_path, "partial", skip=5, rows=24)
    assert "the server log names 19 of the 24 requests" in pred["note"], pred.get("note")
    assert pred["order"] != "the server's log order (exact)"
    assert pred["band"]["low"] <= hits <= pred["band"]["high"]
