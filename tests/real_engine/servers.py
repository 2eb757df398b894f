"""Every server the collected tests need, started together before the first test that needs one.

A server's start is mostly imports, one process after another (the API server, the engine core,
the worker: about one core), so on this machine's 2 cores starts overlap: the suite's four
starts took 257 s one after another and 139-166 s together. Tests then run with no start in
progress: timing-sensitive ones (calibrate) see a quiet machine; idle servers wait (about 2 %
of a core each).

Each kind of server registers under the name of the fixture that hands it out (``register``):
a setup (installs; they run one after another, as two of them write into one virtualenv) and a
factory of the server. The server has ``begin()`` (launch), ``step()`` (True once ready; raises
``EngineError`` on failure) and ``stop()`` (idempotent). No threads: a child started with
``PR_SET_PDEATHSIG`` would die with the thread that forked it.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .engine import TIMINGS


@dataclass(frozen=True)
class Kind:
    setup: Callable[[], Any]  # installs what the server runs from; returns its python
    make: Callable[[Any, Path], Any]  # (python, tiny model) -> the server, not yet begun


KINDS: dict[str, Kind] = {}


def register(fixture: str, setup: Callable[[], Any], make: Callable[[Any, Path], Any]) -> None:
    """The server the fixture ``fixture`` hands out (``Started.get``)."""
    KINDS[fixture] = Kind(setup, make)


class Started:
    """The servers started together, and why the others did not start."""

    def __init__(self) -> None:
        self.servers: dict[str, Any] = {}
        self.errors: dict[str, str] = {}

    def get(self, fixture: str) -> Any:
        """The server of ``fixture``; fails the test (never skips) when it did not start."""
        if fixture in self.errors:
            pytest.fail(self.errors[fixture], pytrace=False)
        if fixture not in self.servers:
            pytest.fail(f"no server was started for {fixture} (servers.register)", pytrace=False)
        return self.servers[fixture]

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()


def start_all(names: Iterable[str], tiny_model: Path) -> Started:
    """Set up, one after another, then start together the servers registered as ``names``;
    returns once each is ready or failed."""
    out, pending = Started(), {}
    made = {}
    for name in sorted(names):
        try:
            made[name] = KINDS[name].make(KINDS[name].setup(), tiny_model)
        except Exception as exc:  # any setup failure fails that fixture's tests
            out.errors[name] = f"{name}: could not be set up: {exc}"
    began = time.monotonic()
    for name, server in made.items():
        try:
            server.begin()
            pending[name] = server
        except Exception as exc:
            server.stop()
            out.errors[name] = f"{name}: {exc}"
    while pending:
        for name, server in list(pending.items()):
            try:
                done = server.step()
            except Exception as exc:  # EngineError, or the log unreadable
                server.stop()  # what is left of it (a group of several servers: the others)
                out.errors[name] = str(exc)
                del pending[name]
                continue
            if done:
                del pending[name]
                out.servers[name] = server
                TIMINGS[f"{name} ready after"] = time.monotonic() - began
        time.sleep(0.5)
    if made:
        TIMINGS[f"{len(made)} servers started together in"] = time.monotonic() - began
    return out
