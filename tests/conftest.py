"""Shared helpers for the test suite."""
from __future__ import annotations

import compileall
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import mmdatagen
from mmdatagen.cli import cli

# With PYTHONDONTWRITEBYTECODE set, pytest cannot keep the test modules it rewrites for its
# assertion messages (nor the hypothesis modules it rewrites as a plugin's): every xdist worker
# rewrote and compiled them all at every collection, about 6 s of each worker's 12. This
# process may write them (tests/__pycache__, ``*-pytest-*.pyc``, written atomically); the
# subprocesses the tests start keep the environment as it is.
sys.dont_write_bytecode = False


def pytest_sessionstart(session):
    """Byte-compile the package once: the suite's environment may set PYTHONDONTWRITEBYTECODE,
    and then every CLI subprocess compiled mmdatagen from source (measured: ``pool -n 5`` took
    about 3 s instead of 1.6 s). Stale or missing files only; py_compile writes atomically, so
    xdist workers doing this at once are harmless."""
    compileall.compile_dir(Path(mmdatagen.__file__).parent, quiet=1)


def pytest_collection_modifyitems(items):
    """The end-to-end tests (marked slow: 7 to 24 s each) first, the rest in their order:
    pytest-xdist hands tests out in this order, and a long test handed out last keeps one
    worker busy after the other has nothing left."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def run_cli():
    """Invoke the CLI in-process; returns the click Result."""
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return invoke


def run_subprocess(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m mmdatagen`` as a user would."""
    return subprocess.run([sys.executable, "-m", "mmdatagen", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def read_rows(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in Path(path).read_bytes().splitlines() if line.strip()]
