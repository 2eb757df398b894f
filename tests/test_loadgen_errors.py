"""Every request ends as success or a classified error; the HTTP parser survives any split."""
from __future__ import annotations

import asyncio
import socket

import orjson
import pytest
from loadgen_helpers import Stub, bench_config, write_jsonl

from mmdatagen.loadgen.client import Result, _Exchange
from mmdatagen.loadgen.run import run_bench


@pytest.fixture(scope="module")
def stub():
    with Stub() as s:
        yield s


@pytest.mark.parametrize("client", ["raw", "aiohttp"])
@pytest.mark.parametrize("mode,streaming,kind", [
    ("status500", True, "HTTPError"),
    ("reset", True, "ConnectionReset"),
    ("malformed", True, "MalformedStream"),
    ("empty", True, "EmptyResponse"),
    ("empty", False, "EmptyResponse"),
    ("stall", True, "Timeout"),
])
def test_error_classes(stub, tmp_path, mode, streaming, kind, client):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "q"}] * 3)
    res = run_bench(bench_config(path, stub.url, tmp_path / "o", model=mode, streaming=streaming,
                                 concurrency=3, request_timeout=0.5, http_client=client))
    assert len(res.records) == 3
    assert [r.error["type"] for r in res.records] == [kind] * 3
    summary = res.export["error_summary"]
    assert sum(e["count"] for e in summary) == 3
    assert all(e["error_details"]["type"] == kind for e in summary)
    assert res.export["error_request_count"]["avg"] == 3 and res.export["request_count"]["avg"] == 0
    if kind == "HTTPError":
        assert summary[0]["error_details"]["code"] == 500
        assert summary[0]["error_details"]["message"] == "boom"


def test_connection_refused_is_classified(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "q"}] * 2)
    res = run_bench(bench_config(path, f"http://127.0.0.1:{port}", tmp_path / "o"))
    assert [r.error["type"] for r in res.records] == ["ConnectionError"] * 2


def test_bad_local_image_is_an_error_record_not_a_crash(stub, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "q", "image": str(tmp_path / "nope.png")},
                                              {"text": "fine"}])
    res = run_bench(bench_config(path, stub.url, tmp_path / "o"))
    kinds = sorted((r.error or {}).get("type", "ok") for r in res.records)
    assert kinds == ["InvalidRequest", "ok"]


def _response(chunked: bool) -> bytes:
    events = [orjson.dumps({"choices": [{"delta": {"content": f"w{i}"}}]}) for i in range(3)]
    events.append(orjson.dumps({"choices": [], "usage": {"completion_tokens": 3,
                                                         "prompt_tokens": 9}}))
    payload = b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"x-mmdatagen-image-hits: 2\r\nX-Mmdatagen-Image-Misses: 1\r\n")
    if not chunked:
        return head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload
    body = b""
    for i in range(0, len(payload), 7):
        part = payload[i:i + 7]
        body += b"%x;ext=1\r\n" % len(part) + part + b"\r\n"
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("step", [1, 3, 17, 10_000])
def test_parser_any_split(chunked, step):
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
        res = Result(start_ns=0)
        ex = _Exchange(fut, res, streaming=True, collect=True)
        raw = _response(chunked)
        for i in range(0, len(raw), step):
            ex.feed(raw[i:i + step])
        assert fut.done() and ex.state == 3 and ex.keep_alive
        assert res.error is None and res.text == "w0w1w2" and res.chunks == 3
        assert res.usage["completion_tokens"] == 3
        assert (res.image_hits, res.image_misses) == (2, 1)
        assert res.first_ns is not None and res.last_ns >= res.first_ns
    finally:
        loop.close()


def test_parser_eof_mid_body_is_connection_reset():
    loop = asyncio.new_event_loop()
    try:
        res = Result(start_ns=0)
        ex = _Exchange(loop.create_future(), res, streaming=True, collect=False)
        ex.feed(_response(True)[:120])
        ex.eof()
        assert res.error["type"] == "ConnectionReset"
    finally:
        loop.close()
