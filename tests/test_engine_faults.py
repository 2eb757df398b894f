"""Engine faults and which requests a cache prediction counts, against a loopback stand-in for
vLLM's API server.

The stand-in keeps a processor cache (mmdatagen's own LRU model, keyed by the parts' uuids and
sized as bench sizes them), looks every request's images up in arrival order and serves
vLLM's counters at /metrics. The request's text picks what happens: ``ok``; ``empty`` (a 200
whose reply has no text); ``mirror`` (HTTP 500 with vLLM's processor-cache mirror message, after
the lookup); ``invalid`` (HTTP 400 before any lookup); ``drop`` (the connection closed before
any reply). The prediction must count exactly the requests the stand-in looked up.
"""
from __future__ import annotations

import asyncio
import base64
import io
import random
import threading
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from loadgen_helpers import make_run, write_jsonl
from PIL import Image

from mmdatagen.caches import get_target, make_cache
from mmdatagen.caches.entries import entry_size
from mmdatagen.console import console_table
from mmdatagen.loadgen.run import run_bench
from mmdatagen.metrics import NONE, RecordTable, RequestRecord
from mmdatagen.outcomes import engine_faults, engine_processed, engine_processed_rows
from mmdatagen.report.html import runs_report
from mmdatagen.vlm import get_model

MODEL = "qwen2.5-vl-7b"
SIDE = 64
MIRROR = "Expected a cached item for mm_hash='{}'"
KINDS = ("ok", "ok", "empty", "mirror", "ok", "invalid", "ok", "drop")


class FakeVllm:
    """Thread + own event loop; ``hits``/``queries`` as vLLM counts them."""

    def __init__(self, entries: int, jitter_s: float) -> None:
        self.size = entry_size(get_target("vllm-processor"), get_model(MODEL), SIDE, SIDE)
        self.cache = make_cache(get_target("vllm-processor"), entries * self.size)
        self.jitter_s = jitter_s
        self.rng = random.Random(0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.n = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        parts = body["messages"][-1]["content"]
        kind = next(p["text"] for p in parts if p["type"] == "text").split()[0]
        if kind == "drop":
            request.transport.close()
            return web.Response()
        if kind == "invalid":  # refused by validation, before the processor
            return web.json_response({"object": "error", "message": "bad request", "code": 400},
                                     status=400)
        items = [(p["uuid"], self.size) for p in parts if p["type"] == "image_url"]
        self.n += 1
        self.cache.lookup(self.n, items)  # the processor cache, at arrival
        await asyncio.sleep(self.rng.random() * self.jitter_s)
        if kind == "mirror":
            return web.json_response({"object": "error", "type": "InternalServerError",
                                      "message": MIRROR.format(items[0][0]), "code": 500},
                                     status=500)
        text = "" if kind == "empty" else "fine"
        return web.json_response({"choices": [{"message": {"role": "assistant",
                                                            "content": text}}],
                                  "usage": {"prompt_tokens": 9, "completion_tokens": 1}})

    async def metrics(self, request: web.Request) -> web.Response:
        c = self.cache
        return web.Response(text=f"vllm:mm_cache_queries_total {c.queries}\n"
                                 f"vllm:mm_cache_hits_total {c.hits}\n")

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def __enter__(self) -> FakeVllm:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def png(i: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (SIDE, SIDE), (i * 37 % 256, i * 91 % 256, i * 13 % 256)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def dataset(path: Path, rows: int, seed: int) -> Path:
    """Rows of 1-3 images drawn from a pool of 8 (uuids name them), each with a kind."""
    rng = random.Random(seed)
    out = []
    for r in range(rows):
        ids = [rng.randrange(8) for _ in range(rng.randint(1, 3))]
        out.append({"text": f"{KINDS[r % len(KINDS)]} row {r}", "images": [png(i) for i in ids],
                    "image_uuids": [f"img-{i}" for i in ids]})
    return write_jsonl(path, out)


def bench(server: FakeVllm, data: Path, out: Path, concurrency: int, entries: int):
    cache_gb = entries * server.size / (1 << 30)
    cfg = make_run(input_file=data, url=server.url, model=MODEL, output_dir=out, quiet=True,
                   concurrency=concurrency, cache="vllm-processor", cache_gb=cache_gb,
                   metrics_interval=60.0)
    return run_bench(cfg)


@pytest.mark.parametrize("concurrency,jitter", [(1, 0.0), (4, 0.02)])
def test_counting_faults_and_band(tmp_path, concurrency, jitter):
    entries = 3  # of 8 images: the cache evicts
    data = dataset(tmp_path / "d.jsonl", 40, seed=concurrency)
    rows = [orjson.loads(line) for line in data.read_bytes().splitlines()]
    with FakeVllm(entries, jitter) as server:
        result = bench(server, data, tmp_path / "out", concurrency, entries)
        engine = {"hits": server.cache.hits, "queries": server.cache.queries}
    export, records = result.export, result.records
    by_kind: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_kind.setdefault(rows[r.dispatch_index]["text"].split()[0], []).append(r)
    assert {k: {r.error["type"] if r.error else None for r in v} for k, v in by_kind.items()} == {
        "ok": {None}, "empty": {"EmptyResponse"}, "mirror": {"HTTPError"},
        "invalid": {"HTTPError"}, "drop": {"ConnectionReset"}}
    # counted: exactly what the engine looked up (200 with no text and the 500 included)
    looked = sum(len(rows[r.dispatch_index]["images"]) for k in ("ok", "empty", "mirror")
                 for r in by_kind[k])
    pred = export["image_cache"]["predicted"]
    assert pred["references"] == looked == engine["queries"]
    assert [engine_processed(r) for r in by_kind["invalid"] + by_kind["drop"]] == \
        [False] * (len(by_kind["invalid"]) + len(by_kind["drop"]))
    # engine faults, their own class
    mirror = len(by_kind["mirror"])
    faults = export["engine_faults"]
    assert faults == {"count": mirror, "statuses": {"500": mirror},
                      "first_message": faults["first_message"],
                      "known": {"vllm-mm-cache-mirror": mirror}}
    assert faults["first_message"].startswith("Expected a cached item for mm_hash=")
    console = console_table(export)
    assert f"Engine faults: {mirror} requests failed inside the engine (HTTP 500 x{mirror})" \
        in console
    assert "vLLM processor-cache mirror bug (vllm-mm-cache-mirror)" in console
    page = runs_report("bench", [("run", export)], "faults").html()
    assert "Engine faults" in page and "vLLM processor-cache mirror bug" in page
    # the band, and the engine's own hits inside it
    band = pred["band"]
    assert export["image_cache"]["server_metrics"]["hits"] == engine["hits"]
    assert band["all_requests"]["low"] <= engine["hits"] <= band["all_requests"]["high"]
    assert band["measured_inside"] is True and band["measured"] == engine["hits"]
    assert "inside the band" in console
    if concurrency == 1:  # the order is known: exact, and equal to the engine
        assert band["width"] == 0 and pred["hits"] == engine["hits"]
        assert "order band: exact" in console
    else:
        assert band["low"] <= pred["hits"] <= band["high"]
        assert band["method"] in ("exact search", "known (no two requests' windows overlap)")


def _record(error: dict | None, status: int | None, first: int | None = None) -> RequestRecord:
    return RequestRecord("c", 0, "profiling", 0, first, None, 0, None, 1, error, None, None,
                         None, "x", http_status=status)


@pytest.mark.parametrize("error,status,first,counted", [
    (None, 200, 5, True),
    ({"type": "EmptyResponse", "code": None, "message": "no content"}, 200, None, True),
    ({"type": "ServerError", "code": None, "message": "oops"}, 200, None, True),
    ({"type": "HTTPError", "code": 500, "message": MIRROR.format("ab")}, 500, None, True),
    ({"type": "ConnectionReset", "code": None, "message": "closed"}, 200, None, True),
    ({"type": "HTTPError", "code": 400, "message": "bad"}, 400, None, False),
    ({"type": "HTTPError", "code": 503, "message": "no worker"}, 503, None, False),
    ({"type": "ConnectionError", "code": None, "message": "refused"}, None, None, False),
    ({"type": "Timeout", "code": None, "message": "slow"}, None, None, False),
    ({"type": "ConnectionReset", "code": None, "message": "closed"}, None, 7, True),
])
def test_engine_processed_rule(error, status, first, counted):
    assert engine_processed(_record(error, status, first)) is counted
    t = RecordTable.from_records([_record(error, status, first)])  # the columns' form agrees
    assert engine_processed_rows(t.has_error, t.first_token_ns != NONE,
                                 t.http_status).tolist() == [counted]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.one_of(st.none(), st.integers(100, 650)),
                          st.one_of(st.none(), st.integers(0, 9))), max_size=20))
def test_engine_processed_rows_is_the_rule_over_columns(rows):
    records = [_record({"type": "HTTPError", "code": s, "message": "m"} if failed else None,
                       s, first) for failed, s, first in rows]
    t = RecordTable.from_records(records)
    assert engine_processed_rows(t.has_error, t.first_token_ns != NONE, t.http_status
                                 ).tolist() == [engine_processed(r) for r in records]


def test_fault_block_counts_statuses_and_known_bugs():
    recs = [_record({"type": "HTTPError", "code": 500, "message": MIRROR.format("a")}, 500),
            _record({"type": "HTTPError", "code": 503, "message": "overloaded"}, 503),
            _record({"type": "ServerError", "code": None, "message": "engine died"}, 200),
            _record({"type": "HTTPError", "code": 400, "message": "bad"}, 400),
            _record(None, 200, 3)]
    block = engine_faults(recs)
    assert block == {"count": 3, "statuses": {"500": 1, "503": 1, "200": 1},
                     "first_message": MIRROR.format("a"), "known": {"vllm-mm-cache-mirror": 1}}
    assert engine_faults([_record(None, 200, 3)]) == {"count": 0, "statuses": {},
                                                       "first_message": None, "known": {}}
