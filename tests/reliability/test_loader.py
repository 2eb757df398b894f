"""Class 5, the loader: memory bounded whatever a server sends, one failure taxonomy for both
HTTP clients, and a truncated or corrupt .gz dataset named with its line."""
from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import textwrap
import zlib

import pytest

from mmdatagen.loadgen.client import make_client
from mmdatagen.loadgen.failures import ErrorKind

from .helpers import one_error_line, run
from .hostile import canned, hostile_server

CLIENTS = ("raw", "aiohttp")


def _endless(head: bytes, piece: bytes):
    def reply(conn) -> None:
        conn.sendall(head)
        while True:  # until the client hangs up (sendall then fails)
            conn.sendall(piece)
    return reply


def _sse_chunk() -> bytes:
    body = b'data: {"choices":[{"delta":{"content":"xxxxxxxx"}}]}\n\n' * 1000
    return b"%x\r\n%s\r\n" % (len(body), body)


HOSTILE = {
    "2 GB body": _endless(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 2147483648\r\n\r\n", b"\x00" * 65536),
    "endless SSE": _endless(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n", _sse_chunk()),
}

PROBE = textwrap.dedent("""
    import asyncio, sys
    from mmdatagen.loadgen.client import make_client
    async def main():
        c, _ = make_client(sys.argv[1], sys.argv[2], timeout_s=60, headers={},
                           max_response_bytes=int(sys.argv[3]))
        r = await c.request("/v1/chat/completions", b"{}", "", streaming=True, collect_text=True)
        await c.close()
        return r
    r = asyncio.run(main())
    # VmHWM: this process's peak RSS (ru_maxrss would carry over the forking parent's peak)
    hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
    print(r.error["type"] if r.error else "ok", hwm)
""")


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("case", list(HOSTILE))
def test_huge_or_endless_responses_keep_memory_flat(case, client):
    limit = 8 << 20
    with hostile_server(HOSTILE[case]) as url:
        res = subprocess.run([sys.executable, "-c", PROBE, client, url, str(limit)],
                             check=False, capture_output=True, text=True, timeout=120)
    kind, peak_kb = res.stdout.split()
    assert kind == ErrorKind.TOO_LARGE.value, res.stderr
    # the cap bounds what is held: interpreter + aiohttp (~80 MB) + the capped response
    assert int(peak_kb) < 400_000


GARBAGE = {
    "not HTTP": b"HELLO WORLD\r\n\r\n",
    "bad status": b"HTTP/1.1 abc OK\r\n\r\n",
    "bad chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                      b"Content-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "huge head": b"HTTP/1.1 200 OK\r\nX: " + b"a" * 200_000 + b"\r\n\r\n",
    "bad Content-Length": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: x\r\n\r\n{}",
    "invalid JSON": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 5\r\n\r\nnope!",
    "cut short": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 50\r\n\r\n{\"a\":",
    "nothing": b"",
    "error in 200": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 31\r\n"
                    b"\r\n{\"error\":{\"message\":\"boom!!\"}}",
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_same_garbage_is_the_same_kind_with_both_clients(name):
    async def ask(kind: str, url: str):
        client, _ = make_client(kind, url, timeout_s=20, headers={})
        try:
            res = await client.request("/v1/chat/completions", b"{}", "", streaming=False)
        finally:
            await client.close()
        return res.error["type"] if res.error else None

    with hostile_server(canned(GARBAGE[name])) as url:
        kinds = {kind: asyncio.run(ask(kind, url)) for kind in CLIENTS}
    assert kinds["raw"] is not None and kinds["raw"] == kinds["aiohttp"], kinds


@pytest.fixture
def broken_gz(tmp_path, small_dataset):
    data = small_dataset.read_bytes()
    whole = gzip.compress(data)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    corrupt = bytearray(whole)
    corrupt[-8] ^= 0xFF  # the CRC-32 trailer: every row decodes, the end does not check out
    (tmp_path / "bad.jsonl.gz").write_bytes(bytes(corrupt))
    return tmp_path


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "bad.jsonl.gz"])
def test_truncated_or_corrupt_gz_is_named_with_its_line(broken_gz, small_dataset, name):
    # the images are files beside the original dataset: keep them reachable
    for p in small_dataset.parent.iterdir():
        if p.is_dir():
            (broken_gz / p.name).symlink_to(p)
    analyze = run("analyze", name, "--cache-images", 10, cwd=broken_gz)
    assert analyze.returncode == 2
    line = one_error_line(analyze.stderr)
    assert f"{name}:" in line and ("truncated or corrupt" in line or "not valid JSON" in line)
    bench = run("bench", "--input-file", name, "--profile", "zero-delay", "--request-count", 500,
                "-q", "--output-dir", "out", cwd=broken_gz)
    assert bench.returncode == 2 and f"{name}:" in one_error_line(bench.stderr)


BODY = b'{"choices":[{"message":{"content":"hi"}}]}'
SSE = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


def _ok(head: bytes = b"", body: bytes = BODY, kind: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: %d\r\n" % len(body)
            + head + b"\r\n" + body)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# HTTP/1.1 as both clients read it: None is a good response, else the failure's kind
PROTOCOL = {
    "100 Continue first": (b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(), None),  # raw: Timeout
    "103 then 100 first": (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                           b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(), None),
    "gzip SSE": (_ok(b"Content-Encoding: gzip\r\n", gzip.compress(SSE), b"text/event-stream"),
                 None),  # raw: EmptyResponse
    "gzip chunked SSE": (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-"
                         b"Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + _chunk(gzip.compress(SSE)) + b"0\r\n\r\n", None),
    "deflate JSON": (_ok(b"Content-Encoding: deflate\r\n", zlib.compress(BODY)),
                     None),
    "bare LF lines": (b"HTTP/1.1 200 OK\nContent-Length: %d\n\n" % len(BODY) + BODY, None),
    "obsolete folding": (_ok(b"X-A: a\r\n b\r\n"), None),
    "random bytes": (bytes(range(256)) * 20, ErrorKind.MALFORMED),  # raw: ConnectionReset
    "conflicting Content-Length": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: 5\r\n" + _ok()[17:], ErrorKind.MALFORMED),
    "Content-Length list": (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
                            ErrorKind.MALFORMED),
    "chunked and Content-Length": (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: "
                                   b"chunked\r\n\r\n" + _chunk(BODY) + b"0\r\n\r\n",
                                   ErrorKind.MALFORMED),
    "chunk without CRLF": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                           + _chunk(BODY)[:-2] + b"XX0\r\n\r\n", ErrorKind.MALFORMED),
    "header without colon": (_ok(b"garbage\r\n"), ErrorKind.MALFORMED),
    "control byte in a header": (_ok(b"X: a\x00b\r\n"), ErrorKind.MALFORMED),
    "two-digit status": (b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n", ErrorKind.MALFORMED),
    "unknown encoding": (_ok(b"Content-Encoding: br\r\n", b"xx"), ErrorKind.MALFORMED),
    "corrupt gzip": (_ok(b"Content-Encoding: gzip\r\n", b"not gzip"), ErrorKind.MALFORMED),
    "101 unasked": (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", ErrorKind.HTTP),
}


async def _ask(kind: str, url: str, n: int = 1) -> list[str | None]:
    client, _ = make_client(kind, url, timeout_s=10, headers={})
    try:
        out = []
        for _ in range(n):
            res = await client.request("/v1/chat/completions", b"{}", "", streaming=False)
            out.append(res.error["type"] if res.error else None)
        return out
    finally:
        await client.close()


@pytest.mark.parametrize("name", list(PROTOCOL))
def test_both_clients_read_http_1_1_alike(name):
    reply, want = PROTOCOL[name]
    with hostile_server(canned(reply)) as url:
        kinds = {kind: asyncio.run(_ask(kind, url))[0] for kind in CLIENTS}
    expect = None if want is None else want.value
    assert kinds == {"raw": expect, "aiohttp": expect}


def test_a_server_closing_every_kept_alive_connection():
    """No ``Connection: close``, yet each connection ends after one response: both clients
    retry once on a fresh connection (was: aiohttp failed 2 of 5 with ConnectionError)."""
    with hostile_server(canned(_ok())) as url:
        kinds = {kind: asyncio.run(_ask(kind, url, 5)) for kind in CLIENTS}
    assert kinds == {"raw": [None] * 5, "aiohttp": [None] * 5}
