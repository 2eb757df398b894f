"""Start the simulator as a subprocess on a free loopback port (the loader's default target).

    with EmbeddedServer(Simulator().with_values({"profile": "zero-delay"})) as srv:
        ...  # srv.url == "http://127.0.0.1:PORT"

A subprocess, so client and server never share a GIL. Its settings are one typed
:class:`~mmdatagen.settings.sim.Simulator`, sent as JSON on the child's standard input to its one
entry point (``python -m mmdatagen.sim.child``); no command line is built.
"""
from __future__ import annotations

import collections
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Self

from ..errors import UserError
from ..lifecycle import DIE_WITH
from ..settings.sim import Simulator

LISTENING = re.compile(r"listening on (http://\S+)")


def _drain(stream, sink) -> None:
    """Read a child's output line by line until it closes (keeps its pipe from filling)."""
    for raw in iter(stream.readline, b""):
        sink(raw.decode("utf-8", "replace").rstrip())
    stream.close()


class EmbeddedServer:
    """The simulator as a child process that dies with this one (even on SIGKILL: the kernel
    sends it SIGTERM) and leaves nothing on disk: its address comes from its first stdout line."""

    def __init__(self, spec: Simulator, startup_timeout: float = 30.0, grace: float = 5.0
                 ) -> None:
        """``spec``: every setting of the server (``serve``'s defaults where it says nothing);
        it always listens on a free loopback port."""
        self.spec = spec.with_values({"host": "127.0.0.1", "port": 0, "ready_file": None})
        self.startup_timeout, self.grace = startup_timeout, grace
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.port = 0
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)

    def start(self) -> EmbeddedServer:
        lines: queue.Queue[str | None] = queue.Queue()
        # Own session: a Ctrl-C at the terminal reaches the loader only, which then drains its
        # in-flight requests for its grace period and stops the simulator itself.
        # The child asks the kernel for SIGTERM when this process dies (lifecycle.DIE_WITH).
        env = {**os.environ, DIE_WITH: str(os.getpid())}
        proc = self.proc = subprocess.Popen(
            [sys.executable, "-m", "mmdatagen.sim.child"], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.PIPE, start_new_session=True, env=env)
        assert proc.stdin is not None  # PIPE
        try:
            proc.stdin.write(self.spec.to_json())
            proc.stdin.close()
        except OSError:  # it died before reading: its stderr says why (_wait_url)
            pass
        threading.Thread(target=_drain, args=(proc.stdout, lines.put), daemon=True).start()
        threading.Thread(target=_drain, args=(proc.stderr, self._stderr.append),
                         daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout
        try:
            self.url = self._wait_url(proc, lines, deadline)
            self.port = int(self.url.rsplit(":", 1)[1])
            self._wait_healthy(proc, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_url(self, proc: subprocess.Popen, lines: queue.Queue, deadline: float) -> str:
        while True:
            try:
                line = lines.get(timeout=0.05)
            except queue.Empty:
                line = ""
            if line and (m := LISTENING.search(line)):
                return m.group(1)
            if proc.poll() is not None:
                time.sleep(0.05)  # let the stderr reader catch the last words
                raise UserError(f"embedded simulator failed to start: {self._stderr_tail()}")
            if time.monotonic() > deadline:
                raise UserError("embedded simulator did not start in time")

    def _wait_healthy(self, proc: subprocess.Popen, deadline: float) -> None:
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise UserError(f"embedded simulator not healthy: {self._stderr_tail()}")
            time.sleep(0.02)

    def _stderr_tail(self) -> str:
        lines = [x for x in self._stderr if x.strip()]
        return lines[-1] if lines else "no output"

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
        return code

    def __enter__(self) -> Self:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # pragma: no cover - best effort: never leave a server behind
        proc = getattr(self, "proc", None)
        if proc is not None:
            try:
                proc.kill()
            except OSError:
                pass
