#!/usr/bin/env python3
"""Create (or reuse) the virtualenv holding AIPerf 0.13.0, the loader mmdatagen's files must suit.

Lives outside the repository (``$MMDATAGEN_AIPERF_VENV`` or ``~/.cache/mmdatagen/aiperf-0.13.0``).
Built under a file lock; a stamp written as the last step marks it complete, and a folder without
the stamp is rebuilt from nothing, so a half-built or concurrent build is never used. Installs ``uv`` with pip, then AIPerf with uv and
pip's own configured sources (about 20 s cold); pip alone when uv fails. Prints the venv's python;
on failure one ``error:`` line and exit status 1 (the suite fails, it never skips).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .setup_engine import SetupError, _run, build_locked, ensure_bytecode, pip_sources

AIPERF_VERSION = "0.13.0"


def default_venv() -> Path:
    env = os.environ.get("MMDATAGEN_AIPERF_VENV")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "mmdatagen" / f"aiperf-{AIPERF_VERSION}"


def _ready(venv: Path) -> bool:
    return (venv / "bin" / "python").exists() and (venv / "aiperf.stamp").is_file()


def _build(venv: Path, log) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)], "create the AIPerf virtualenv", log)
    py = str(venv / "bin" / "python")
    wanted = f"aiperf=={AIPERF_VERSION}"
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           "--progress-bar", "off", "--no-compile"]
    try:
        _run(pip + ["uv"], "install uv", log)
        flags, env = pip_sources(py)
        _run([str(venv / "bin" / "uv"), "pip", "install", "--python", py, "--no-cache",
              "--index-strategy", "unsafe-best-match", *flags, wanted], f"install {wanted} (uv)",
             log, env)
    except SetupError as exc:
        print(f"[setup-aiperf] uv failed, using pip: {str(exc).splitlines()[0]}", file=log,
              flush=True)
        _run(pip + [wanted], f"install {wanted} (pip)", log)
    _run([py, "-c", "import aiperf.dataset.loader.single_turn, aiperf.endpoints.openai_chat"],
         "import check", log)
    (venv / "aiperf.stamp").write_text(AIPERF_VERSION)


def ensure(venv: Path | None = None, log=sys.stderr) -> Path:
    """The AIPerf venv's python, building the venv first when needed."""
    venv = Path(venv) if venv is not None else default_venv()
    build_locked(venv, _ready, _build, "setup-aiperf", log)
    ensure_bytecode(venv, log, "setup-aiperf")
    return venv / "bin" / "python"
