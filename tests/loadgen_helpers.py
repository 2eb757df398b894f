"""A small SSE stub server (thread + own event loop) and dataset helpers for the loader tests.

Behaviour is chosen by the request's ``model``: ``ok`` (default), ``status500``, ``reset``
(connection closed mid-stream), ``malformed`` (bad SSE JSON), ``empty`` (no content), ``stall``
(never answers within the test's timeout), ``slow`` (0.2 s per response), ``echo`` (replies with
the number of messages received). Every request is logged with arrival/finish times.
``serve`` runs ``mmdatagen serve`` in its own process; ``with_common_start`` gives sharded load
workers their common ``--start-at``.
"""
from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def serve(folder: Path, *args: str) -> Iterator[str]:
    """``mmdatagen serve`` (zero-delay profile, ``args`` after) in its own process; its URL."""
    ready = folder / "ready.json"
    ready.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "mmdatagen", "serve", "--port", "0",
                             "--profile", "zero-delay", *args, "--ready-file", str(ready)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() or not ready.read_text().strip().endswith("}"):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.05)
        yield orjson.loads(ready.read_bytes())["url"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# Sharded load workers started as cold processes wait for one common --start-at (test_shard,
# test_k8s). Each is ready for it (imports, dataset, clock probes) about 1 s after it starts
# alone, 2-3 s when four start at once on a busy 2-core machine. A worker ready after the start
# refuses it (exit 2, "--start-at is ... in the past") before sending anything: the run is then
# made again from a fresh server with the next, longer margin.
START_MARGINS_S = (6.0, 15.0, 45.0)


def late_for_the_start(workers: list[subprocess.Popen]) -> list[str]:
    """Wait for the workers (stderr piped as text); the stderr of each that refused the common
    start because it came too late. Any other failure fails the test."""
    late = []
    for w in workers:
        err = w.communicate(timeout=300)[1] or ""
        code = w.returncode
        if code == 2 and "--start-at is" in err and "s in the past" in err:
            late.append(err)
        else:
            assert code == 0, err
    return late


def with_common_start(attempt: Callable[[float], list[str]]) -> None:
    """``attempt(margin)`` starts a fresh server, then the workers with ``--start-at`` that many
    seconds ahead, and returns ``late_for_the_start`` of them; made again with the next margin
    while any was late, failing when every margin was too short."""
    late: list[str] = []
    for margin in START_MARGINS_S:
        late = attempt(margin)
        if not late:
            return
    raise AssertionError(f"workers not ready {START_MARGINS_S[-1]} s after they started: "
                         f"{late[0]}")
