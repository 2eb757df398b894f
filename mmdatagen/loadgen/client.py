"""HTTP clients for the loader: a lean raw-asyncio HTTP/1.1 keep-alive client (default) and aiohttp.

Both return a :class:`Result` with monotonic-ns timestamps taken where bytes arrive: the request
start just before the first byte is written, the first and last *content* chunks (SSE events
whose delta carries text), and the last byte of the response. Every failure becomes a classified
``error`` dict from one taxonomy (``failures.ErrorKind``: the same reply is the same kind with
either client); nothing raises out of ``request``. A response larger than ``max_response_bytes``
(default 64 MiB) stops being read and is ``ResponseTooLarge``: memory stays bounded whatever the
server sends (a 2 GB body, an endless stream).

Both read HTTP/1.1 alike (``tests/reliability/test_loader.py``): interim 1xx responses are
skipped, gzip/deflate bodies decoded, a kept-alive connection the server closed before answering
is retried once on a fresh one; two framings (conflicting Content-Length values, Content-Length
with chunked), a bad header line or bytes that are not HTTP are ``MalformedStream``.

Why raw by default (measured with benchmarks/bench_loadgen.py, one run, shared 2-core machine):
short non-streaming requests at concurrency 32 against a zero-delay server, raw ~10,800 req/s vs
aiohttp ~4,500 req/s (2.4x; AIPerf 0.13.0 ~660 req/s); client-added TTFT p50 at concurrency 64
0.47 ms raw vs 12 ms aiohttp. The raw client is an asyncio Protocol that parses responses inside
``data_received`` and timestamps bytes as they arrive, with no per-request ClientResponse /
StreamReader machinery. aiohttp remains for https and as a cross-check.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import orjson

from ..errors import SpecError
from ..exportmodel import ErrorDetails
from .failures import (
    DEFAULT_MAX_RESPONSE_BYTES,
    ErrorKind,
    classify_aiohttp,
    error,
    too_large,
)

_now = time.perf_counter_ns
MAX_HEAD = 64 * 1024
CACHE_HEADERS = (b"x-mmdatagen-image-hits", b"x-mmdatagen-image-misses",
                 b"x-mmdatagen-server-ttft-ns")


@dataclass
class Result:
    """One request's outcome; times are ``time.perf_counter_ns`` values."""

    start_ns: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    end_ns: int | None = None
    status: int | None = None
    chunks: int = 0
    text: str | None = None
    usage: dict | None = None
    image_hits: int | None = None
    image_misses: int | None = None
    server_ttft_ns: int | None = None
    error: ErrorDetails | None = None  # the export form of a failures.RequestFailure


_TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"  # header name bytes (lower)
_HEAD_BYTES = bytes(b for b in range(256) if b in (9, 10, 13) or 31 < b != 127)  # no control
_READ = frozenset((b"content-length", b"content-encoding", b"transfer-encoding", b"connection",
                   b"content-type"))  # the framing headers the client reads
_CACHE_FIELDS = dict(zip(CACHE_HEADERS, ("image_hits", "image_misses", "server_ttft_ns")))


def _head_end(data: bytes) -> tuple[int, int]:
    """Where a response head ends and its terminator's length ((-1, 0): not yet)."""
    crlf, lf = data.find(b"\r\n\r\n"), data.find(b"\n\n")
    if lf >= 0 and (crlf < 0 or lf < crlf):
        return lf, 2
    return crlf, 4


def _content_length(value: bytes) -> int | None:
    """A Content-Length value: digits only (a list, a sign or a space inside is invalid)."""
    return int(value) if value.isdigit() else None


def _int_or_none(v: bytes | str | None) -> int | None:
    try:
        return None if v is None else int(v)
    except ValueError:
        return None


class _Content:
    """Extracts content/usage/errors from SSE events or a JSON body into a Result."""

    __slots__ = ("collect", "done", "malformed", "parts", "res")

    def __init__(self, res: Result, collect: bool) -> None:
        self.res = res
        self.collect = collect
        self.parts: list[str] | None = [] if collect else None
        self.malformed: str | None = None
        self.done = False

    def event(self, raw: bytes, ts: int) -> None:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.malformed = f"invalid JSON in stream: {raw[:80]!r}"
            return
        if not isinstance(obj, dict):
            self.malformed = "stream event is not a JSON object"
            return
        self.absorb(obj, ts, delta=True)

    def absorb(self, obj: dict, ts: int, delta: bool) -> None:
        err = obj.get("error")
        if err is not None and self.res.error is None:
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            code = err.get("code") if isinstance(err, dict) else None
            self.res.error = error(ErrorKind.SERVER, str(msg)[:300], code)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.res.usage = usage
        choices = obj.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            return
        c0 = choices[0]
        src = c0.get("delta" if delta else "message")
        text = None
        if isinstance(src, dict):
            text = src.get("content") or src.get("reasoning_content")
        if not text:
            text = c0.get("text")
        if text:
            res = self.res
            if res.first_ns is None:
                res.first_ns = ts
            res.last_ns = ts
            res.chunks += 1
            if self.parts is not None:
                self.parts.append(text if isinstance(text, str) else str(text))


class _Exchange:
    """Parses one HTTP/1.1 response as bytes arrive (head, then chunked/length/close framing)."""

    __slots__ = (
        "body",
        "buf",
        "chunked",
        "content",
        "decoder",
        "fut",
        "got_bytes",
        "is_sse",
        "keep_alive",
        "length",
        "limit",
        "received",
        "res",
        "sse",
        "state",
        "streaming",
    )

    def __init__(self, fut: asyncio.Future, res: Result, streaming: bool, collect: bool,
                 limit: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.fut = fut
        self.res = res
        self.content = _Content(res, collect)
        self.streaming = streaming
        self.state = 0  # 0 head, 1 body, 2 chunk trailer, 3 done
        self.buf = b""
        self.length: int | None = None
        self.chunked = False
        self.sse = b""
        self.body: list[bytes] = []
        self.keep_alive = True
        self.is_sse = False
        self.got_bytes = False
        self.received = 0
        self.limit = limit
        self.decoder: Any = None  # a zlib decompressor for a gzip/deflate Content-Encoding

    def over_limit(self, n: int) -> bool:
        """Count ``n`` more bytes; past the limit, fail the exchange (the caller stops reading)."""
        self.received += n
        if self.received > self.limit:
            self.fail(too_large(self.limit))
            return True
        return False

    # -- framing -------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        ts = _now()
        self.got_bytes = True
        self.res.end_ns = ts
        if self.over_limit(len(data)):
            return
        if self.state == 0:
            rest = self._heads(self.buf + data if self.buf else data)
            if rest is None:
                return
            data = rest
            self.state = 1
            if self.length == 0 and not self.chunked:
                return self.finish(ts)
            if not data:
                return
        if self.chunked:
            self._chunked(data, ts)
        elif self.length is not None:
            if len(data) >= self.length:
                if len(data) > self.length:
                    self.keep_alive = False
                self._payload(data[:self.length], ts)
                self.length = 0
                self.finish(ts)
            else:
                self.length -= len(data)
                self._payload(data, ts)
        else:
            self._payload(data, ts)  # close-delimited

    def _heads(self, data: bytes) -> bytes | None:
        """Parse heads until the final one (interim 1xx responses such as ``100 Continue``
        are skipped, as HTTP/1.1 asks); the bytes after it, or None (incomplete or failed)."""
        while True:
            if not b"HTTP/".startswith(data[:5]):  # not HTTP from its first bytes on
                self.fail(error(ErrorKind.MALFORMED, f"not an HTTP response: {data[:40]!r}"))
                return None
            i, sep = _head_end(data)
            if i < 0:
                if len(data) > MAX_HEAD:
                    self.fail(error(ErrorKind.MALFORMED, "response head too large"))
                    return None
                self.buf = data
                return None
            self.buf = b""
            if not self._head(data[:i]):
                return None
            data = data[i + sep:]
            status = self.res.status or 0
            if not (100 <= status < 200 and status != 101):
                return data
            self.res.status = None  # interim: the final response follows on this connection

    def _head(self, head: bytes) -> bool:
        self.length, self.chunked, self.is_sse, self.decoder = None, False, False, None
        status, _, fields = head.partition(b"\n")  # a bare LF ends a line too
        if not self._status(status.removesuffix(b"\r")):
            return False
        if fields.translate(None, _HEAD_BYTES):  # a control byte anywhere in the head
            self.fail(error(ErrorKind.MALFORMED, f"control byte in the head {fields[:40]!r}"))
            return False
        res, names = self.res, []
        # every value the client reads compares without case: the block is lowered once
        for line in fields.lower().split(b"\n") if fields else ():
            if line.startswith((b" ", b"\t")):
                continue  # obsolete line folding: the previous value goes on (none we read)
            name, colon, value = line.partition(b":")
            if name[-1:] in (b" ", b"\t"):
                name = name.rstrip(b" \t")
            if not colon or not name:
                self.fail(error(ErrorKind.MALFORMED, f"bad header line {line[:40]!r}"))
                return False
            names.append(name)
            if name in _CACHE_FIELDS:
                setattr(res, _CACHE_FIELDS[name], _int_or_none(value))
            elif name in _READ and not self._header(name, value.strip()):
                return False
        if b"".join(names).translate(None, _TOKEN):  # every name a token (RFC 9110)
            self.fail(error(ErrorKind.MALFORMED, f"bad header name in {fields[:40]!r}"))
            return False
        if self.chunked and self.length is not None:  # framing two ways: refused (smuggling)
            self.fail(error(ErrorKind.MALFORMED, "both Transfer-Encoding and Content-Length"))
            return False
        if self.length is None and not self.chunked:
            self.keep_alive = False
        return True

    def _status(self, line: bytes) -> bool:
        parts = line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            self.fail(error(ErrorKind.MALFORMED, f"not an HTTP response: {line[:60]!r}"))
            return False
        if not (len(parts[1]) == 3 and parts[1].isdigit()):
            self.fail(error(ErrorKind.MALFORMED, "bad HTTP status line"))
            return False
        self.res.status = int(parts[1])
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        return True

    def _header(self, name: bytes, value: bytes) -> bool:
        """One framing header of the response head (name and value lower-case); False when
        it fails the response."""
        if name == b"content-length":
            length = _content_length(value)
            if length is None or (self.length is not None and length != self.length):
                self.fail(error(ErrorKind.MALFORMED, f"bad or conflicting Content-Length "
                                                     f"{value[:40]!r}"))
                return False
            self.length = length
        elif name == b"content-encoding":
            return self._decoding(value)
        elif name == b"transfer-encoding":
            self.chunked = b"chunked" in value
        elif name == b"connection":
            if value == b"close":
                self.keep_alive = False
        elif name == b"content-type":
            self.is_sse = b"text/event-stream" in value
        return True

    def _chunked(self, data: bytes, ts: int) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        n = len(buf)
        while pos < n:
            if self.state == 2:  # after the zero-size chunk: optional trailers then CRLF
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                else:
                    j = buf.find(b"\r\n\r\n", pos)
                    if j < 0:
                        break
                    pos = j + 4
                if pos < n:
                    self.keep_alive = False
                self.buf = b""
                return self.finish(ts)
            j = buf.find(b"\r\n", pos)
            if j < 0:
                break
            try:
                size = int(buf[pos:j].split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.buf = b""
                return self.fail(error(ErrorKind.MALFORMED, "bad chunk size"))
            if size == 0:
                self.state = 2
                pos = j + 2
                continue
            end = j + 2 + size
            if end + 2 > n:
                break
            if buf[end:end + 2] != b"\r\n":
                self.buf = b""
                return self.fail(error(ErrorKind.MALFORMED, "chunk data not followed by CRLF"))
            self._payload(buf[j + 2:end], ts)
            pos = end + 2
        self.buf = buf[pos:] if pos < n else b""

    def _decoding(self, coding: bytes) -> bool:
        """gzip and deflate bodies are decoded as they arrive (as aiohttp does); any other
        coding is a body this client cannot read."""
        import zlib

        if coding in (b"", b"identity"):
            return True
        if coding in (b"gzip", b"x-gzip", b"deflate"):
            self.decoder = zlib.decompressobj(47 if coding != b"deflate" else 15)
            return True
        self.fail(error(ErrorKind.MALFORMED, f"unsupported content encoding {coding[:20]!r}"))
        return False

    # -- payload -------------------------------------------------------------------------
    def _payload(self, data: bytes, ts: int) -> None:
        if self.decoder is not None:
            import zlib

            try:
                data = self.decoder.decompress(data)
            except zlib.error as exc:
                return self.fail(error(ErrorKind.MALFORMED, f"bad {exc.__class__.__name__} in "
                                                            f"an encoded body: {exc}"))
            if self.over_limit(len(data)):  # a small encoded body may inflate to gigabytes
                return
        if self.is_sse and self.res.status == 200:
            buf = self.sse + data if self.sse else data
            lines = buf.split(b"\n")
            self.sse = lines.pop()
            content = self.content
            for line in lines:
                if line.startswith(b"data:"):
                    val = line[5:].strip()
                    if val == b"[DONE]":
                        content.done = True
                    elif val:
                        content.event(val, ts)
        else:
            self.body.append(data)

    def finish(self, ts: int) -> None:
        if self.state == 3:
            return
        self.state = 3
        res = self.res
        res.end_ns = ts
        self._tail(ts)
        if res.error is None:
            res.error = self._verdict(b"".join(self.body), res.status or 0, ts)
        if self.content.parts is not None:
            res.text = "".join(self.content.parts)
        if not self.fut.done():
            self.fut.set_result(None)

    def _tail(self, ts: int) -> None:
        """What the decoder and the SSE buffer still hold at the end of the body."""
        if self.decoder is not None:
            tail, self.decoder = self.decoder.flush(), None
            if tail:
                self._payload(tail, ts)
        line = self.sse.strip()
        self.sse = b""
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
            self.content.event(line[5:].strip(), ts)

    def _verdict(self, body: bytes, status: int, ts: int) -> ErrorDetails | None:
        """The failure a complete response means, if any (its content absorbed)."""
        content = self.content
        if status >= 400 or status < 200:
            return error(ErrorKind.HTTP, _error_message(body) or f"HTTP {status}", status)
        if not self.is_sse:
            try:
                obj = orjson.loads(body) if body else None
            except orjson.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict):
                return (error(ErrorKind.EMPTY, "empty response body") if not body.strip()
                        else error(ErrorKind.MALFORMED, f"response is not JSON: {body[:80]!r}"))
            content.absorb(obj, ts, delta=False)
        if self.res.error is not None:  # an error object inside the response
            return self.res.error
        if content.malformed:
            return error(ErrorKind.MALFORMED, content.malformed)
        if self.res.first_ns is None:
            return error(ErrorKind.EMPTY, "response carried no content")
        return None

    def fail(self, err: ErrorDetails) -> None:
        self.state = 3
        self.keep_alive = False
        if self.res.error is None:
            self.res.error = err
        if not self.fut.done():
            self.fut.set_result(None)

    def eof(self) -> None:
        """The peer closed the connection."""
        if self.state == 3:
            return
        self.keep_alive = False
        if self.state == 1 and not self.chunked and self.length is None:
            return self.finish(_now())  # close-delimited body
        what = "mid-stream" if self.got_bytes else "before any response"
        self.fail(error(ErrorKind.RESET, f"connection closed {what}"))


class _Conn(asyncio.Protocol):
    """One keep-alive connection; routes bytes to the current exchange."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.ex: _Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection gives a stream transport; uvloop's is not an asyncio.Transport
        # subclass, so this is a cast, not a check
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None or ex.state == 3:
            self.closed = True  # unsolicited bytes: do not reuse
            if self.transport:
                self.transport.close()
            return
        ex.feed(data)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.ex is not None:
            self.ex.eof()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _error_message(body: bytes) -> str:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace").strip()
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        return str(err)[:300]
    return str(obj)[:300]


@dataclass(frozen=True)
class Target:
    """A parsed base URL."""

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SpecError("url", f"must be http(s)://host[:port], got {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise SpecError("url", f"has a bad port: {url!r}") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def path_for(self, endpoint_path: str) -> str:
        """Base path + endpoint path, without doubling ``/v1`` when the URL already ends in it."""
        if self.base_path.endswith("/v1") and endpoint_path.startswith("/v1/"):
            return self.base_path + endpoint_path[3:]
        return self.base_path + endpoint_path


class RawClient:
    """Minimal HTTP/1.1 keep-alive client over asyncio (plain http only)."""

    def __init__(self, target: Target, *, timeout_s: float, headers: dict[str, str],
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        if target.scheme != "http":
            raise SpecError("http_client", "raw speaks plain http; use aiohttp for https")
        self.target = target
        self.timeout_s = timeout_s
        self.limit = max_response_bytes
        self.idle: list[_Conn] = []
        host = target.host if target.port == 80 else f"{target.host}:{target.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._fixed = (f"Host: {host}\r\nContent-Type: application/json\r\n"
                       f"Accept: application/json, text/event-stream\r\n{extra}").encode("latin-1")

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Conn, self.target.host, self.target.port)
        return conn

    async def request(self, path: str, body: bytes, headers: str, *, streaming: bool,
                      collect_text: bool = False) -> Result:
        """POST ``body`` to ``path``; ``headers`` is extra ``K: V\\r\\n`` text (per request)."""
        head = (f"POST {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n{headers}".encode("latin-1")
                + self._fixed + b"\r\n")
        res = Result()
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            reused = bool(self.idle)
            res = Result(start_ns=_now())
            try:
                conn = self.idle.pop() if reused else await self._connect()
            except OSError as exc:
                res.end_ns = _now()
                res.error = error(ErrorKind.CONNECT, f"cannot connect: {exc.strerror or exc}")
                return res
            fut = loop.create_future()
            ex = _Exchange(fut, res, streaming, collect_text, self.limit)
            conn.ex = ex
            timer = loop.call_later(self.timeout_s, _timeout, ex, conn, self.timeout_s)
            try:
                if conn.closed or conn.transport is None or conn.transport.is_closing():
                    ex.eof()
                elif len(body) > 65536:
                    conn.transport.write(head)
                    conn.transport.write(body)
                else:
                    conn.transport.write(head + body)
                await fut
            except asyncio.CancelledError:
                conn.close()
                raise
            finally:
                timer.cancel()
                conn.ex = None
            if ex.keep_alive and ex.state == 3 and not conn.closed:
                self.idle.append(conn)
            else:
                conn.close()
            # a stale keep-alive connection closed by the server before answering: retry once
            if (reused and attempt == 0 and res.error is not None
                    and res.error["type"] == ErrorKind.RESET.value and not ex.got_bytes):
                continue
            return res
        return res

    async def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


def _timeout(ex: _Exchange, conn: _Conn, seconds: float) -> None:
    ex.fail(error(ErrorKind.TIMEOUT, f"no complete response within {seconds:g} s"))
    conn.close()


class AiohttpClient:
    """The same interface over aiohttp (https, and the comparison in the benchmark)."""

    def __init__(self, target: Target, *, timeout_s: float, headers: dict[str, str],
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        import aiohttp

        self.aiohttp = aiohttp
        self.limit = max_response_bytes
        self.base = f"{target.scheme}://{target.host}:{target.port}"
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", **headers}
        trace = aiohttp.TraceConfig()  # which requests went out on a reused connection
        trace.on_connection_reuseconn.append(_mark_reused)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False), timeout=self.timeout,
            skip_auto_headers=("User-Agent",), trace_configs=[trace])

    async def request(self, path: str, body: bytes, headers: str, *, streaming: bool,
                      collect_text: bool = False) -> Result:
        hdrs = dict(self.headers)
        for line in headers.split("\r\n"):
            if line:
                k, _, v = line.partition(":")
                hdrs[k.strip()] = v.strip()
        for attempt in (0, 1):
            reused: dict[str, bool] = {}
            res, ex = await self._attempt(path, body, hdrs, streaming, collect_text, reused)
            # a kept-alive connection the server closed before answering: retry once, as the
            # raw client does (HTTP/1.1 lets a server close an idle connection at any time)
            if not (attempt == 0 and reused and res.status is None and not ex.got_bytes
                    and res.error is not None and res.error["type"] == ErrorKind.RESET.value):
                return res
        return res

    async def _attempt(self, path: str, body: bytes, hdrs: dict[str, str], streaming: bool,
                       collect_text: bool, reused: dict[str, bool]) -> tuple[Result, _Exchange]:
        res = Result(start_ns=_now())
        fut = asyncio.get_running_loop().create_future()
        ex = _Exchange(fut, res, streaming, collect_text, self.limit)
        ex.state = 1
        try:
            async with self.session.post(self.base + path, data=body, headers=hdrs,
                                         trace_request_ctx=reused) as resp:
                res.status = resp.status
                ex.is_sse = "text/event-stream" in resp.headers.get("Content-Type", "")
                h = resp.headers
                res.image_hits = _int_or_none(h.get("x-mmdatagen-image-hits"))
                res.image_misses = _int_or_none(h.get("x-mmdatagen-image-misses"))
                res.server_ttft_ns = _int_or_none(h.get("x-mmdatagen-server-ttft-ns"))
                async for data in resp.content.iter_any():
                    ts = _now()
                    res.end_ns = ts
                    ex.got_bytes = True
                    if ex.over_limit(len(data)):
                        resp.close()  # drop the connection: the rest is never read
                        break
                    ex._payload(data, ts)
                else:
                    ex.finish(_now())
        except (TimeoutError, self.aiohttp.ClientError, OSError) as exc:
            ex.fail(classify_aiohttp(exc, self.timeout_s))
        if res.end_ns is None:
            res.end_ns = _now()
        return res, ex

    async def close(self) -> None:
        await self.session.close()


async def _mark_reused(_session: Any, ctx: Any, _params: Any) -> None:
    if isinstance(ctx.trace_request_ctx, dict):
        ctx.trace_request_ctx["reused"] = True


Client = RawClient | AiohttpClient  # the same request() and close()


def make_client(kind: str, url: str, *, timeout_s: float, headers: dict[str, str],
                max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> tuple[Client, Target]:
    """``raw`` (default; falls back to aiohttp for https) or ``aiohttp``."""
    target = Target.parse(url)
    cls: type[Client] = RawClient if kind == "raw" and target.scheme == "http" else AiohttpClient
    return cls(target, timeout_s=timeout_s, headers=headers,
               max_response_bytes=max_response_bytes), target
