"""How mmdatagen processes start, stop and fail: one place for signals and environment errors.

- SIGTERM (what ``timeout``, Docker and Kubernetes send) is handled like Ctrl-C: it raises
  :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread, so every ``finally`` and
  every write-then-rename clean-up runs; the exit code is 128 + the signal number.
- SIGXFSZ is ignored, so a file-size limit (``ulimit -f``) makes the write fail with EFBIG
  instead of killing the process with a core dump.
- Child processes (image workers, the embedded simulator) call :func:`die_with_parent`: the
  kernel signals them when their parent dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``).
- :func:`describe_os_error` turns an environment failure (disk full, file too large,
  permission denied) into one sentence; the CLI prints it as ``error: ...`` with exit code 1.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1
EXIT_ENVIRONMENT = 1  # the machine failed us (disk full, file-size limit, permissions)
EXIT_USER = 2         # bad input (flags, files, datasets)
DIE_WITH = "MMDATAGEN_DIE_WITH_PARENT"  # env: a child command dies with this parent pid


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) received: stop like Ctrl-C, exit with 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


_installed = False


def install_handlers() -> None:
    """In a command's main process: SIGTERM/SIGHUP raise :class:`Terminated`; SIGXFSZ ignored."""
    global _installed
    _installed = True
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _raise_terminated)
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    parent = os.environ.pop(DIE_WITH, None)
    if parent and parent.isdigit():  # started by EmbeddedServer: stop (SIGTERM) with it
        die_with_parent(signal.SIGTERM, int(parent))


def interrupt_exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C, 128 + N for a signal N turned into :class:`Terminated`."""
    return exc.exit_code if isinstance(exc, Terminated) else 130


def exit_now(code: int) -> None:
    """Leave at once after an interrupt, once the ``finally`` blocks have removed what this run
    wrote: flush the standard streams, then skip the interpreter's joins of worker-pool
    threads (a pool whose workers were killed can keep them busy for seconds). Inside a
    program that did not install the handlers (tests, an embedding application): SystemExit."""
    if not _installed:
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


_libc: Any = None


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    Call it in the child (a pool initializer, or ``Popen(preexec_fn=...)``). ``parent`` is the
    pid the child expects as its parent: if that one already died before the call, exit now.
    Returns False where the platform has no such facility.
    """
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        if _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:
        os._exit(128 + int(sig))
    return True


def child_setup(parent: int, sig: int = signal.SIGKILL, ignore_interrupts: bool = True) -> None:
    """A worker process's start: die with ``parent``; leave Ctrl-C/SIGTERM to the parent,
    which stops its workers itself (so a keypress never prints a traceback per worker)."""
    die_with_parent(sig, parent)
    if ignore_interrupts:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


_ENV_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EFBIG: "file too large (file-size "
               "limit reached)", errno.EDQUOT: "disk quota exceeded", errno.EROFS:
               "read-only file system", errno.EIO: "input/output error"}


def describe_os_error(exc: OSError) -> str:
    """One sentence for an environment failure: what failed, on which file when known."""
    what = _ENV_ERRNOS.get(exc.errno or 0) or (exc.strerror or str(exc) or type(exc).__name__)
    name = exc.filename
    if name is not None:
        return f"cannot write {os.fsdecode(name)!s}: {what}" if exc.errno in _ENV_ERRNOS \
            else f"{os.fsdecode(name)!s}: {what}"
    return what


def is_environment_error(exc: BaseException) -> bool:
    """An OSError from the machine (disk full, quota, size limit, I/O), not from user input."""
    return isinstance(exc, OSError) and exc.errno in _ENV_ERRNOS
