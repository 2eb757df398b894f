"""How mmdatagen processes start, stop and fail: one place for signals and environment errors.

- SIGTERM (what ``timeout``, Docker and Kubernetes send) is handled like Ctrl-C: it raises
  :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread, so every ``finally`` and
  every write-then-rename clean-up runs; the exit code is 128 + the signal number.
- SIGXFSZ is ignored, so a file-size limit (``ulimit -f``) makes the write fail with EFBIG
  instead of killing the process with a core dump.
- Child processes (image workers, the embedded simulator) call :func:`die_with_parent`: the
  kernel signals them when their parent dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``).
- :func:`start_workers` is the one process pool (image generation, the record readers of
  ``merge-runs``): forked children set up that way, killed by :func:`stop_workers` when the
  ``with`` block is left by an exception.
- :func:`describe_os_error` turns an environment failure (disk full, file too large,
  permission denied) into one sentence; the CLI prints it as ``error: ...`` with exit code 1.
- :func:`outcome` is THE exit-code policy, for every command and the embedded simulator: 143
  SIGTERM, 130 SIGINT, 1 a failed run or the machine (disk full, stdout closed), 2 bad input.
- :func:`raise_stopped`: a run that caught a signal itself (to write its partial export) stops
  the same way afterwards, so its exit code is the signal's.
- :func:`guard_standard_streams`: every write to standard output is checked (a short write on a
  full disk or under ``ulimit -f`` is an error, not a silently cut file); a closed stdout is an
  error on the first write, and its file descriptor is never reused by an output file.
- :func:`run_loop`: THE event loop of a long-lived asyncio program (the loader, the
  simulator): uvloop's where it is installed (the ``fast`` extra), else asyncio's.
- :func:`rare_full_collections`: while a benchmark's requests run, and while merge-runs joins a
  million records, the cycle collector's full collections wait (their pause grows with every
  live object: in a run's records, a TTFT outlier; in a merge, seconds).
"""
from __future__ import annotations

import contextlib
import errno
import functools
import gc
import io
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar

from .errors import RunFailed, SpecError, UserError

T = TypeVar("T")

# ctypes, multiprocessing and concurrent.futures' process pool are imported where they are
# used: every command imports this module first, and they cost about 50 ms of each start
if TYPE_CHECKING:
    from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

PR_SET_PDEATHSIG = 1
EXIT_ENVIRONMENT = 1  # the machine failed us (disk full, file-size limit, permissions)
EXIT_FAILED = 1       # the run failed (every request failed)
EXIT_USER = 2         # bad input (flags, files, datasets)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
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
    return exc.exit_code if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def raise_stopped(signum: int) -> NoReturn:
    """Stop like the signal ``signum`` would have (after a run that handled it itself)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


class StdoutError(OSError):
    """A write to standard output failed (closed, full disk, file-size limit, closed pipe)."""


def outcome(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and the one stderr line for an exception that ends a command; None for a
    programming error (it keeps its traceback). A :class:`~mmdatagen.errors.SpecError` is
    worded with its flag by the caller first (``settings.base.for_cli``)."""
    if isinstance(exc, KeyboardInterrupt):
        code = interrupt_exit_code(exc)
        return code, "interrupted" if code == EXIT_INTERRUPTED else "terminated"
    if isinstance(exc, RunFailed):
        return EXIT_FAILED, f"error: {exc}"
    if isinstance(exc, UserError):
        return EXIT_USER, f"error: {exc}"
    if isinstance(exc, StdoutError):
        return EXIT_ENVIRONMENT, f"error: cannot write to standard output: {describe_os_error(exc)}"
    if isinstance(exc, OSError):  # disk full, file-size limit: exit 1; a bad path: exit 2
        return (EXIT_ENVIRONMENT if is_environment_error(exc) else EXIT_USER,
                f"error: {describe_os_error(exc)}")
    return None


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end on a new event loop: uvloop's where it is installed, else
    asyncio's own."""
    import asyncio

    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


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


def _c_library() -> Any:
    """The C library's functions, through the process's own symbols (loaded once)."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    Call it in the child (a pool initializer, or ``Popen(preexec_fn=...)``). ``parent`` is the
    pid the child expects as its parent: if that one already died before the call, exit now.
    Returns False where the platform has no such facility.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _c_library().prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
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


class _CheckedWriter(io.RawIOBase):
    """File descriptor 1 with every write checked: a short write is retried until the kernel
    refuses (then :class:`StdoutError`); a descriptor closed at start refuses every write."""

    def __init__(self, fd: int, closed: bool) -> None:
        super().__init__()
        self.fd, self.was_closed = fd, closed

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return not self.was_closed and os.isatty(self.fd)

    def write(self, data: Any) -> int:
        if self.was_closed:
            raise StdoutError(errno.EBADF, "standard output is closed")
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                n = os.write(self.fd, view[done:])
            except OSError as exc:
                raise StdoutError(exc.errno, exc.strerror) from None
            if n == 0:
                raise StdoutError(errno.EIO, "nothing written")
            done += n
        return done


def _occupy(fd: int) -> bool:
    """Open /dev/null on ``fd`` when it is closed (so no output file gets that number and
    receives what was meant for the terminal); True when it was closed."""
    try:
        os.fstat(fd)
        return False
    except OSError:
        pass
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
    return True


def guard_standard_streams() -> None:
    """In a command's main process, before any output: ``sys.stdout`` checks every write (see
    :class:`_CheckedWriter`); non-UTF-8 paths are printed as their bytes (surrogateescape)."""
    err_closed = _occupy(2)
    out_closed = _occupy(1)
    old = sys.stdout
    encoding = getattr(old, "encoding", None) or "utf-8"
    if old is not None:
        try:
            old.flush()
        except (OSError, ValueError):
            pass
    raw = _CheckedWriter(1, out_closed)
    tty = raw.isatty()
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding,
                                  errors="surrogateescape", line_buffering=tty, write_through=tty)
    if err_closed or sys.stderr is None:
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)


def silence_stdout() -> None:
    """After a standard-output error was reported: point fd 1 at /dev/null and drop what is
    buffered, so the interpreter's final flush cannot fail (and print) again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass
    raw = getattr(getattr(sys.stdout, "buffer", None), "raw", None)
    if isinstance(raw, _CheckedWriter):
        raw.was_closed = False
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass


@functools.cache
def _pools() -> tuple[type[ProcessPoolExecutor], type[ThreadPoolExecutor]]:
    """The process pool and the thread pool ``start_workers`` makes (defined on first use)."""
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    class _Workers(ProcessPoolExecutor):
        """A process pool whose ``with`` block, left by an exception (Ctrl-C, SIGTERM, a full
        disk), cancels the queued tasks and kills the workers instead of waiting for them."""

        def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                     tb: TracebackType | None) -> Literal[False]:
            if exc_type is None:
                self.shutdown(wait=True)
            else:
                stop_workers(self)
            return False

    class _Threads(ThreadPoolExecutor):
        def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                     tb: TracebackType | None) -> Literal[False]:
            self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)
            return False

    return _Workers, _Threads


def stop_workers(executor: Executor) -> None:
    """Stop now: cancel queued work and kill worker processes (they hold no state worth
    keeping; their half-written files are temporaries the caller removes)."""
    procs = list((getattr(executor, "_processes", None) or {}).values())
    manager = getattr(executor, "_executor_manager_thread", None)  # shutdown forgets it
    executor.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(OSError, AttributeError, ValueError, AssertionError):
            proc.join(2)
    # the pool's manager thread closes its wake-up pipe as it ends; an exit while it still
    # runs races Python's own exit hook writing to that pipe (3.11: "Exception ignored ...
    # Bad file descriptor" after the error line, 2 of 40 exits under load)
    if manager is not None:
        manager.join(2)


def pool_size(workers: int = 0) -> int:
    """The processes ``workers`` asks for: 0 is one per core (at most 8)."""
    if workers < 0:
        raise SpecError("workers", "must be zero (all cores) or positive")
    return workers or min(os.cpu_count() or 1, 8)


def start_workers(workers: int = 0) -> Executor:
    """Worker processes (forked: nothing to re-import), threads where fork is missing. Fork
    before starting threads of one's own (tokenizer loading does).

    Workers die with this process even when it is SIGKILLed (``lifecycle.die_with_parent``)
    and leave Ctrl-C and SIGTERM to it: it stops them (``stop_workers``) within a second.
    """
    import multiprocessing

    workers = pool_size(workers)
    processes, threads = _pools()
    if "fork" not in multiprocessing.get_all_start_methods():
        return threads(workers)
    pool = processes(workers, mp_context=multiprocessing.get_context("fork"),
                     initializer=child_setup, initargs=(os.getpid(),))
    pool.submit(int).result()  # launch the processes now
    return pool


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def large_frees_to_os(threshold: int = 1 << 20) -> bool:
    """Every allocation of ``threshold`` bytes or more gets pages of its own, handed back to the
    system when freed. glibc raises that threshold to the largest block freed so far (up to
    32 MiB), after which a process that churns large numpy arrays keeps their pages: merge-runs
    of a million records peaked 120 MiB higher so. False where the C library is not glibc."""
    try:
        return bool(_c_library().mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def rare_full_collections() -> Iterator[None]:
    """The objects alive now are never scanned by the cycle collector again until the block
    ends (``gc.freeze``), and its full collections wait for the end too; young cycles (an
    aborted request's) are still collected by generations 0 and 1. Measured: 40,000 requests
    against a zero-delay server paused up to 45 ms in a full collection, which put the run's
    TTFT maximum at 47 ms (p99 2.4 ms); merge-runs of a million records with cache items spent
    about 6 s of 29 in collections. Inside another freeze (``gc.freeze`` by the caller) it
    leaves the frozen objects to that caller: ``gc.unfreeze`` would release them all."""
    low, mid, full = gc.get_threshold()
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    gc.set_threshold(low, mid, 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(low, mid, full)
        if ours:
            gc.unfreeze()
