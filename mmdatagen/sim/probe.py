"""A minimal closed-loop client for the simulator's own checks (agreement test, calibration
in real time, server throughput). Rows without sessions only; the full loader is
``mmdatagen bench``. Bodies are serialised before the clock starts.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson

from ..io.readers import iter_turns


def chat_bodies(path: Path, model: str, count: int, extra: dict | None = None,
                stream: bool = True) -> list[bytes]:
    """Serialised chat bodies for the first ``count`` requests of a dataset (cycled)."""
    from ..io.encode import encode_file
    from ..io.imageref import parse_ref, resolve_path

    encoded: dict[str, str] = {}  # local files are encoded once, as the loader does
    rows = []
    for t in iter_turns(Path(path)):
        parts: list[dict[str, object]] = [{"type": "text", "text": s} for s in t.texts]
        uuids: list[str | None] = [*t.image_uuids] if t.image_uuids else [None] * len(t.images)
        for ref, u in zip(t.images, uuids):
            if parse_ref(ref).kind == "path":
                if ref not in encoded:
                    encoded[ref] = encode_file(resolve_path(ref, Path(path).parent))
                ref = encoded[ref]
            part: dict[str, object] = {"type": "image_url", "image_url": {"url": ref}}
            if u is not None:
                part["uuid"] = u
            parts.append(part)
        body = {"model": model, "messages": [{"role": "user", "content": parts}],
                "stream": stream, **(extra or {})}
        if stream:
            body["stream_options"] = {"include_usage": True}
        rows.append(orjson.dumps(body))
    return [rows[i % len(rows)] for i in range(count)]


async def drive(url: str, bodies: list[bytes], concurrency: int, warmup: int = 0,
                path: str = "/v1/chat/completions") -> list:
    """Send ``bodies`` in order with ``concurrency`` slots (warmup drained first)."""
    import aiohttp

    from ..exportmodel import ErrorDetails
    from ..metrics import RequestRecord

    records: list[RequestRecord] = []
    headers = {"Content-Type": "application/json"}

    async def one(sess: aiohttp.ClientSession, i: int, body: bytes, phase: str) -> None:
        first = last = None
        n = 0
        start = time.perf_counter_ns()
        async with sess.post(url + path, data=body, headers=headers) as resp:
            h = resp.headers
            if resp.content_type == "text/event-stream":
                async for line in resp.content:
                    if line.startswith(b"data: {") and (b'"content"' in line or b'"text"' in line):
                        last = time.perf_counter_ns()
                        first = first or last
                        n += 1
            else:
                doc = await resp.read()
                last = first = time.perf_counter_ns()
                n = orjson.loads(doc).get("usage", {}).get("completion_tokens", 0)
            err: ErrorDetails | None = None if resp.status == 200 else {
                "type": "http", "code": resp.status, "message": ""}
        records.append(RequestRecord(
            conversation_id=f"row{i}", turn_index=0, phase=phase, start_ns=start,
            first_token_ns=first, end_ns=last, output_tokens=n, input_tokens=None, num_images=0,
            error=err, image_hits=int(h.get("x-mmdatagen-image-hits", 0)),
            image_misses=int(h.get("x-mmdatagen-image-misses", 0)),
            server_ttft_ns=int(h.get("x-mmdatagen-server-ttft-ns", 0)), x_request_id=str(i)))

    async def phase_run(sess, items: list[tuple[int, bytes]], phase: str) -> None:
        it = iter(items)

        async def slot() -> None:
            for i, b in it:
                await one(sess, i, b, phase)

        await asyncio.gather(*(slot() for _ in range(concurrency)))

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as sess:
        items = list(enumerate(bodies))
        await phase_run(sess, items[:warmup], "warmup")
        await phase_run(sess, items[warmup:], "profiling")
    return records
