"""Open a local HTML file in headless Chromium and read it back over the DevTools protocol.

Loopback only: Chromium listens on 127.0.0.1 (``--remote-debugging-port=0``), we talk to it
over a websocket with aiohttp. Returns console errors, uncaught exceptions, every URL the page
requested, and the result of a JavaScript expression.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


async def _inspect(port: int, url: str, expression: str, timeout: float) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json(content_type=None)
        page = next(t for t in targets if t.get("type") == "page")
        async with s.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 10_000))
            errors: list[str] = []
            requested: list[str] = []
            loaded = asyncio.Event()
            pending: dict[int, asyncio.Future] = {}

            async def call(method: str, **params):
                i = next(ids)
                fut = asyncio.get_running_loop().create_future()
                pending[i] = fut
                await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                return await asyncio.wait_for(fut, timeout)

            async def reader():
                async for msg in ws:
                    d = json.loads(msg.data)
                    if "id" in d and d["id"] in pending:
                        pending.pop(d["id"]).set_result(d.get("result") or d.get("error"))
                        continue
                    m, p = d.get("method"), d.get("params") or {}
                    if m == "Runtime.exceptionThrown":
                        det = p.get("exceptionDetails") or {}
                        errors.append("exception: " + str(det.get("text")) + " "
                                      + str((det.get("exception") or {}).get("description")))
                    elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                        errors.append("console.error: " + " ".join(
                            str(a.get("value", a.get("description"))) for a in p.get("args", [])))
                    elif m == "Log.entryAdded" and (p.get("entry") or {}).get("level") == "error":
                        errors.append("log: " + str(p["entry"].get("text")) + " "
                                      + str(p["entry"].get("url") or ""))
                    elif m == "Network.requestWillBeSent":
                        requested.append((p.get("request") or {}).get("url", ""))
                    elif m == "Page.loadEventFired":
                        loaded.set()

            task = asyncio.ensure_future(reader())
            try:
                for dom in ("Runtime", "Log", "Page", "Network"):
                    await call(f"{dom}.enable")
                await call("Page.navigate", url=url)
                await asyncio.wait_for(loaded.wait(), timeout)
                await asyncio.sleep(0.3)  # let late console messages arrive
                res = await call("Runtime.evaluate", expression=expression, returnByValue=True)
            finally:
                task.cancel()
            value = ((res or {}).get("result") or {}).get("value")
            return {"errors": errors, "requested": requested, "value": value}


def _stop(proc: subprocess.Popen) -> None:
    """Stop Chromium and every process it started (renderers, GPU, crashpad).

    Chromium runs in its own session, so its process group holds all its helpers. Terminating
    only the browser let a helper write into the profile directory while it was being removed
    ("Directory not empty: 'Default'"). Wait until the whole group is gone.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not _live_members(proc.pid):
                return
            time.sleep(0.05)
    raise RuntimeError(f"chromium's process group {proc.pid} survived SIGKILL")


def _live_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that still run (zombies left to an idle init do not count)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            live.append(int(stat.parent.name))
    return live


def inspect_page(path: Path, expression: str, timeout: float = 60.0) -> dict:
    """Load ``path`` in headless Chromium; errors, requested URLs and ``expression``'s value."""
    exe = chromium_path()
    if exe is None:
        raise RuntimeError("chromium is not installed: `apt-get install -y chromium` "
                           "(make test does this on Debian)")
    with tempfile.TemporaryDirectory(prefix="mmdatagen-chromium-") as profile, \
            tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + timeout
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None:
                    err.seek(0)
                    raise RuntimeError("chromium exited: "
                                       + err.read().decode(errors="replace")[-500:])
                if time.monotonic() > deadline:
                    raise RuntimeError("chromium did not open its DevTools port in time")
                time.sleep(0.05)
            port = int(port_file.read_text().splitlines()[0])
            return asyncio.run(_inspect(port, Path(path).resolve().as_uri(), expression,
                                        timeout))
        finally:
            _stop(proc)
