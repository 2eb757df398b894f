"""Real subprocesses and signals for the reliability suite (loopback only, bounded in time)."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

MMDATAGEN = [sys.executable, "-m", "mmdatagen"]
STOP_BOUND_S = 10.0  # generous on a shared 2-core machine; before the fix: 17-23 s, or never


def start(*args, cwd: Path, fsize: int | None = None, **kw) -> subprocess.Popen:
    """``mmdatagen ARGS`` as a user starts it (Ctrl-C not ignored, optional file-size limit)."""
    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.Popen([*MMDATAGEN, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=setup,  # restores Ctrl-C, sets a limit
                            **kw)


def run(*args, cwd: Path, fsize: int | None = None, timeout: float = 120,
        stdout=None) -> subprocess.CompletedProcess:
    def setup() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([*MMDATAGEN, *map(str, args)], cwd=cwd, check=False,
                          preexec_fn=setup,
                          stdout=stdout if stdout is not None else subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def survivors(pids: list[int], timeout: float = 10.0) -> list[int]:
    """The pids still running after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def stop(proc: subprocess.Popen, sig: int, timeout: float = 60) -> tuple[int, float, str]:
    """Send ``sig``; returns (exit code, seconds to exit, stderr)."""
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, time.monotonic() - t0, err.decode(errors="replace")


def kill_tree(proc: subprocess.Popen) -> None:
    """Test clean-up: never leave this test's processes behind."""
    for pid in children(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def listing(folder: Path) -> list[str]:
    """Every path under ``folder`` (hidden ones too), relative and sorted."""
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


def one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]
