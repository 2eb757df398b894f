"""Helpers for the simulator tests: an in-process server on a free loopback port."""
from __future__ import annotations

import asyncio
import base64
import io
import socket
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from mmdatagen.sim.faults import FaultConfig
from mmdatagen.sim.profile import Profile, load_profile
from mmdatagen.sim.server import SimServer

MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"


def fast_profile(**kw) -> Profile:
    """A quick profile: 1 ms steps, no frontend; tests stay fast but exercise the step loop."""
    base = dict(step_base_ms=1.0, per_seq_ms=0.0, per_prefill_token_ms=0.0,
                per_encoder_token_ms=0.0, per_encoder_image_ms=0.0, frontend_request_ms=0.0,
                frontend_image_ms=0.0, url_fetch_ms=0.0, max_running=64, natural_output_tokens=7,
                text_bytes_per_token=4.0, encoder_async_fraction=0.0, token_budget=8192)
    base.update(kw)
    return load_profile("qwen3-vl-30b-gb200").with_overrides(**base)


def png_url(colour=(10, 20, 30), size=(640, 480), fmt="PNG") -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, fmt)
    mime = "png" if fmt == "PNG" else fmt.lower()
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def chat(parts, **kw) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": parts}]}
    body.update(kw)
    return body


@asynccontextmanager
async def running(profile: Profile | None = None, cache_gb: float = 1.0, **kw):
    """Yield (base_url, SimServer, aiohttp session) for an in-process server."""
    sim = SimServer(profile or fast_profile(), cache_gb, kw.pop("time_scale", 1.0),
                    kw.pop("faults", None) or FaultConfig(), **kw)
    runner = web.AppRunner(sim.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    await web.SockSite(runner, sock).start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as sess:
            yield url, sim, sess
    finally:
        await runner.cleanup()


def run(coro):
    return asyncio.run(coro)
