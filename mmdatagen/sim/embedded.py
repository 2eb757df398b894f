"""Start ``mmdatagen serve`` as a subprocess on a free loopback port (the loader's default target).

    with EmbeddedServer("qwen3-vl-30b-gb200", cache_gb=10) as srv:
        ...  # srv.url == "http://127.0.0.1:PORT"

A subprocess, so client and server never share a GIL.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..errors import UserError


class EmbeddedServer:
    def __init__(self, profile: str = "qwen3-vl-30b-gb200", cache_gb: float = 10.0,
                 extra_args: list[str] | tuple[str, ...] = (), time_scale: float = 1.0,
                 startup_timeout: float = 30.0, grace: float = 5.0) -> None:
        self.profile, self.cache_gb = profile, cache_gb
        self.extra_args, self.time_scale = list(extra_args), time_scale
        self.startup_timeout, self.grace = startup_timeout, grace
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.port = 0
        self._tmp: tempfile.TemporaryDirectory | None = None

    def start(self) -> EmbeddedServer:
        self._tmp = tempfile.TemporaryDirectory(prefix="mmdatagen-serve-")
        ready = Path(self._tmp.name) / "ready.json"
        log = open(Path(self._tmp.name) / "stderr.log", "wb")
        cmd = [sys.executable, "-m", "mmdatagen", "serve", "--host", "127.0.0.1", "--port", "0",
               "--profile", self.profile, "--embedding-cache-gb", str(self.cache_gb),
               "--time-scale", str(self.time_scale), "--ready-file", str(ready), *self.extra_args]
        # Own session: a Ctrl-C at the terminal reaches the loader only, which then drains its
        # in-flight requests for its grace period and stops the simulator itself.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while not ready.exists():
            if self.proc.poll() is not None:
                raise UserError(f"embedded simulator failed to start: {self._stderr_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise UserError("embedded simulator did not start in time")
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        self.port, self.url = info["port"], info["url"]
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise UserError(f"embedded simulator not healthy: {self._stderr_tail()}")
            time.sleep(0.02)

    def _stderr_tail(self) -> str:
        try:
            text = (Path(self._tmp.name) / "stderr.log").read_text(errors="replace").strip()
        except (OSError, AttributeError):
            return "no output"
        return text.splitlines()[-1] if text else "no output"

    def stop(self) -> int | None:
        """SIGTERM, then kill after the grace period; returns the exit code."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(self.grace)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
            self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return code

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # pragma: no cover - best effort: never leave a server behind
        if getattr(self, "proc", None) is not None:
            try:
                self.proc.kill()
            except OSError:
                pass
