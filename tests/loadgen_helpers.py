"""A small SSE stub server (thread + own event loop) and dataset helpers for the loader tests.

Behaviour is chosen by the request's ``model``: ``ok`` (default), ``status500``, ``reset``
(connection closed mid-stream), ``malformed`` (bad SSE JSON), ``empty`` (no content), ``stall``
(never answers within the test's timeout), ``slow`` (0.2 s per response), ``echo`` (replies with
the number of messages received). Every request is logged with arrival/finish times.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import orjson
from aiohttp import web


class Stub:
    def __init__(self) -> None:
        self.log: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        entry = {"body": body, "headers": dict(request.headers), "arrive": time.monotonic()}
        self.log.append(entry)
        mode = body.get("model", "ok")
        stream = body.get("stream", False)
        n_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 3)
        reply = [f"t{i} " for i in range(n_tokens)]
        if mode == "echo":
            reply = [f"reply-{len(body.get('messages', []))}"]
        hdrs = {"x-mmdatagen-image-hits": "1", "x-mmdatagen-image-misses": "0",
                "x-mmdatagen-server-ttft-ns": "1000"}
        try:
            if mode == "status500":
                return web.json_response({"error": {"message": "boom", "code": 500}}, status=500)
            if mode == "stall":
                await asyncio.sleep(5)
            if mode == "slow":
                await asyncio.sleep(0.2)
            if not stream:
                content = "" if mode == "empty" else "".join(reply)
                return web.json_response(
                    {"choices": [{"message": {"role": "assistant", "content": content}}],
                     "usage": {"prompt_tokens": 7, "completion_tokens": len(reply)}},
                    headers=hdrs)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **hdrs})
            await resp.prepare(request)
            if mode == "malformed":
                await resp.write(b"data: {not json\n\n")
            for i, tok in enumerate(reply):
                if mode == "empty":
                    break
                if mode == "reset" and i == 1:
                    request.transport.close()
                    return resp
                chunk = {"choices": [{"delta": {"content": tok}}]}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await resp.write(b"data: " + orjson.dumps(
                {"choices": [], "usage": {"prompt_tokens": 7,
                                          "completion_tokens": 0 if mode == "empty" else len(reply)}})
                + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            entry["finish"] = time.monotonic()

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> Stub:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    with open(path, "wb") as fh:
        for row in rows:
            fh.write(orjson.dumps(row) + b"\n")
    return path


def bench_config(path: Path, url: str, out: Path, **kw):
    """A run against ``url`` (the stub's defaults: model ``ok``, quiet, no prediction)."""
    kw.setdefault("model", "ok")
    kw.setdefault("quiet", True)
    kw.setdefault("predict", False)
    return make_run(input_file=path, url=url, output_dir=out, **kw)


def make_run(*, predict: bool = True, cache_gb: float | None = None, cache: str | None = None,
             encoder_budget: int | None = None, url: str | None = None,
             output_dir: Path = Path("artifacts/bench"), metrics_url: str | None = None,
             extra_inputs: dict | None = None, headers: dict | None = None,
             sim_args: list | tuple = (), goodput: dict | None = None, **load):
    """A ``settings.run.BenchRun`` from the loader's settings by name, as tests give them: the
    load's fields as keywords, plus values the CLI would take as strings (``extra_inputs`` and
    ``headers`` dicts, ``goodput`` {tag: ms}), ``predict`` and the cache's and target's."""
    import orjson

    from mmdatagen.settings.cache import BenchCache
    from mmdatagen.settings.load import BenchTarget, Load
    from mmdatagen.settings.run import BenchRun

    spec = Load(no_predict=not predict, sim_args=tuple(sim_args),
                extra_inputs=(orjson.dumps(extra_inputs).decode(),) if extra_inputs else (),
                headers=tuple(f"{k}:{v}" for k, v in (headers or {}).items()), **load)
    return BenchRun(spec, BenchTarget(url=url, metrics_url=metrics_url, output_dir=output_dir),
                    BenchCache(cache=cache, cache_size=cache_gb, encoder_budget=encoder_budget),
                    slos=tuple((goodput or {}).items()))
