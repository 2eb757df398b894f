"""Run the simulator server until SIGINT/SIGTERM: bind, announce the port, serve, shut down."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from ..errors import SpecError, UserError
from ..io.atomic import atomic_write_bytes, check_target
from ..lifecycle import raise_stopped, run_loop
from .faults import FaultConfig
from .server import SimServer

if TYPE_CHECKING:
    from ..settings.sim import Simulator


class OneLineBadRequests(logging.Filter):
    """aiohttp logs a malformed request (bad request line, header, framing) with a traceback; the
    client already got its 400, so the log gets one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            detail = " ".join(str(exc.message).split())[:160]
            record.msg, record.args = "mmdatagen serve: 400 for a malformed request from %s: %s", (
                peer, detail)
            record.exc_info, record.exc_text = None, None
        return True


def quiet_bad_requests() -> None:
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, OneLineBadRequests) for f in logger.filters):
        logger.addFilter(OneLineBadRequests())


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SpecError("host", f"{host} cannot be resolved: {exc.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve_forever(sim: SimServer, host: str, port: int, ready_file: Path | None,
                        quiet: bool = False) -> int | None:
    """Serve until SIGINT/SIGTERM (removing ``ready_file`` then); returns the signal."""
    quiet_bad_requests()
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"
    runner = web.AppRunner(sim.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=0.5)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    stop = asyncio.Event()
    stopped_by: list[int] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: int) -> None:
        stopped_by.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        if ready_file is not None:
            atomic_write_bytes(ready_file, json.dumps({"url": url, "port": bound,
                                                       "pid": os.getpid()}).encode())
        print(f"mmdatagen serve: listening on {url} (profile {sim.p.name}, "
              f"cache {sim.engine.target.name} {sim.cache_size:g} {sim.engine.target.unit}, "
              f"time scale {sim.scale:g}; "
              "a performance model, not a language model)", flush=True)
        await stop.wait()
    finally:
        if ready_file is not None:  # a stopped server is not ready: its address goes with it
            with contextlib.suppress(OSError):
                os.unlink(ready_file)
        await runner.cleanup()
        if not quiet:
            print(f"mmdatagen serve: shut down; {sim.timing_report()}", file=sys.stderr, flush=True)
    return stopped_by[0] if stopped_by else None


def run(sim: SimServer, host: str, port: int, ready_file: Path | None) -> None:
    if ready_file is not None:  # a missing or unwritable folder: one line before binding
        folder = Path(ready_file).parent
        if not folder.is_dir():
            raise SpecError("ready_file", f"folder {folder} does not exist")
        check_target(Path(ready_file), force=True)
    signum = run_loop(serve_forever(sim, host, port, ready_file))
    if signum is not None:
        raise_stopped(signum)  # exit 143 (SIGTERM) or 130 (Ctrl-C), as every command


def serve_spec(settings: Simulator) -> None:
    """``mmdatagen serve`` and the embedded simulator (``sim/child.py``): build the simulator
    from its spec and run it until stopped."""
    from .study import engine_model, load_engine_profile

    server, cache = settings.server, settings.cache
    prof = load_engine_profile(settings.engine, cache)
    sim = SimServer(prof, cache.cache_size, server.time_scale,
                    FaultConfig.from_spec(settings.faults).validate(), server.api_key,
                    tuple(server.served_model_name), model=engine_model(prof, settings.geometry))
    run(sim, server.host, server.port, server.ready_file)
