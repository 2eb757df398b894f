"""Write-then-rename helpers: a target path holds either nothing or a complete file.

- :func:`atomic_open` / :func:`atomic_write_bytes`: one file, written aside and renamed.
- :func:`atomic_group`: several files (an export) renamed into place only once all are written.
- :func:`staged_dir`: a folder built aside and swapped in whole (no earlier run's files survive).
- :func:`output_lock`: one writer per output (an advisory ``fcntl`` lock beside it).
- :func:`check_target` / :func:`check_not_input`: refuse unwritable, over-long, non-UTF-8 or
  protected targets before any work starts.
- :func:`writing`: how a command that writes into a folder starts: its inputs declared, the
  folder locked, its outputs checked (the three above, in that order).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from ..errors import SpecError, UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()
NAME_MAX = 255


def _parent(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


STEM_BYTES = 120  # a hidden companion's name (lock, temporary) keeps this much of the output's


def _stem(name: str) -> str:
    """The part of an output's name its hidden companions (``.<stem>.lock``, ``.<stem>.X.part``)
    carry: the whole name when short, else a prefix and a hash of the whole name, so two long
    names that share their first characters never share a lock or a temporary file."""
    raw = os.fsencode(name)
    if len(raw) <= STEM_BYTES:
        return name
    prefix = name[:80]
    while len(os.fsencode(prefix)) > 80:  # whole characters only
        prefix = prefix[:-1]
    return f"{prefix}~{hashlib.sha256(raw).hexdigest()[:16]}"


def _hidden(path: Path, suffix: str) -> Path:
    return _parent(path) / f".{_stem(path.name)}{suffix}"


def check_path_text(path: Path) -> None:
    """Refuse a path that is not valid UTF-8 (rows and manifests are JSON, which is UTF-8)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"path {os.fsencode(path)!r} is not valid UTF-8; rename it") from None


def check_name(path: Path, longest_suffix: str = "") -> None:
    """Refuse a file name the file system cannot hold together with ``longest_suffix``."""
    try:
        limit = os.pathconf(_parent(path), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = NAME_MAX
    need = len(os.fsencode(path.name + longest_suffix))
    if need > limit:
        extra = f" (with {longest_suffix!r} added)" if longest_suffix else ""
        raise UserError(f"file name {path.name[:40]}... is too long: {need} bytes{extra}, the "
                        f"file system allows {limit}")


def check_target(path: Path, force: bool, longest_suffix: str = "") -> None:
    """Refuse to overwrite without ``force``; fail early when the folder cannot be written."""
    path = Path(path)
    check_path_text(path)
    if path.exists() and not force:
        raise SpecError("force", f"is needed: {path} exists")
    if path.is_dir():
        raise UserError(f"{path} is a directory")
    parent = _parent(path)
    if parent.exists() and not parent.is_dir():
        raise UserError(f"cannot write {path}: {parent} is not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create folder {parent}: {exc.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"cannot write to folder {parent}")
    check_name(path, longest_suffix)


_INPUTS: dict[tuple[int, int], tuple[Path, str]] = {}  # (dev, inode) -> (path, real path)
_READERS: dict[tuple[int, int], int] = {}  # how many open ``reading`` blocks declared each


@contextlib.contextmanager
def reading(inputs: Iterable[Path | str | None]) -> Iterator[None]:
    """Declare the files and folders a run reads. Until the block ends, every write of this
    module (:func:`atomic_open`, :func:`atomic_group`, :func:`staged_dir`) refuses to replace
    one of them, or to swap in a folder that holds one: one line, exit 2, the input intact.
    Blocks nest (a command declares what its library calls declare too)."""
    added = []
    for p in inputs:
        if p is None:
            continue
        try:
            st = os.stat(p)
        except (OSError, ValueError):
            continue  # not there (yet): nothing to protect
        key = (st.st_dev, st.st_ino)
        _INPUTS.setdefault(key, (Path(p), os.path.realpath(p)))
        _READERS[key] = _READERS.get(key, 0) + 1
        added.append(key)
    try:
        yield
    finally:
        for key in added:
            _READERS[key] -= 1
            if not _READERS[key]:
                del _READERS[key], _INPUTS[key]


def check_not_input(outputs: Iterable[Path], inputs: Iterable[Path | str | None] = ()) -> None:
    """THE "is this path an input of the run?" check (no ``--force`` overrides it): refuse an
    output that is one of ``inputs`` or of the inputs declared by an enclosing :func:`reading`
    (the same file under any name: the inode is compared), or an output folder (replaced whole)
    that holds one. Commands call it on their outputs before any work; every write of this
    module calls it again on its own target."""
    with reading(inputs):
        for out in outputs:
            _refuse_input(Path(out))


def _refuse_input(out: Path) -> None:
    if not _INPUTS:
        return
    try:
        st = os.stat(out)
    except (OSError, ValueError):
        return
    hit = _INPUTS.get((st.st_dev, st.st_ino))
    if hit is not None:
        same = "" if os.path.realpath(out) == hit[1] else f" (the same file as {hit[0]})"
        raise UserError(f"{out} is an input of this run{same}; choose another output")
    if stat.S_ISDIR(st.st_mode):  # a folder output is replaced whole
        inside = os.path.realpath(out).rstrip(os.sep) + os.sep
        held = next((v for v in _INPUTS.values() if v[1].startswith(inside)), None)
        if held is not None:
            raise UserError(f"{out} holds {held[0]}, an input of this run; choose another "
                            "output")


def hidden_temp(path: Path) -> tuple[int, str]:
    """A new hidden temporary beside ``path`` (``.<stem>.XXXXXXXX.part``: the name a killed
    writer's leftovers are recognised by); its descriptor and name."""
    # A short prefix: the final name may use the whole NAME_MAX, the temporary one must fit too.
    try:
        return tempfile.mkstemp(prefix=f".{_stem(path.name)}.", suffix=".part", dir=_parent(path))
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``path``; rename it over ``path`` only on success."""
    path = Path(path)
    _refuse_input(path)
    fd, tmp = hidden_temp(path)
    try:
        os.fchmod(fd, _FILE_MODE)  # mkstemp makes 0600; finished files get the usual mode
        with os.fdopen(fd, mode) as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (safe when several shards write the same file)."""
    with atomic_open(path, "wb") as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_group() -> Iterator[Callable[[Path], IO]]:
    """Open several files aside; rename them all into place only when every one is written.

        with atomic_group() as open_:
            with open_(a) as fh: ...
            with open_(b) as fh: ...

    On any failure (disk full halfway through the second file) every temporary file is removed
    and no target changes: an export is whole or absent.
    """
    staged: list[tuple[str, Path]] = []

    def open_(path: Path) -> IO:
        path = Path(path)
        _refuse_input(path)
        fd, tmp = hidden_temp(path)
        staged.append((tmp, path))
        os.fchmod(fd, _FILE_MODE)
        return os.fdopen(fd, "wb")

    try:
        yield open_
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


@contextlib.contextmanager
def staged_dir(final: Path, force: bool) -> Iterator[Path]:
    """Build a folder aside (``.<name>.XXXX.part`` beside it) and swap it in whole on success.

    An existing ``final`` is replaced only with ``force`` (so a smaller run over a larger one
    leaves none of the earlier files); on failure or interrupt the staging folder is removed and
    ``final`` is untouched.
    """
    final = Path(final)
    check_path_text(final)
    _refuse_input(final)
    if final.exists() and not final.is_dir():
        raise UserError(f"{final} exists and is not a folder")
    if final.exists() and not force and any(final.iterdir()):
        raise SpecError("force", f"is needed: image folder {final} exists")
    parent = _parent(final)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{_stem(final.name)}.", suffix=".part", dir=parent))
    except OSError as exc:
        raise UserError(f"cannot create image folder {final}: {exc.strerror}") from None
    try:
        os.chmod(stage, 0o777 & ~_umask())
        yield stage
        old = None
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{_stem(final.name)}.", suffix=".old", dir=parent))
            os.replace(final, old / "x")
        os.replace(stage, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def remove_stale(path: Path) -> None:
    """Remove temporaries a killed writer of ``path`` left (``.<name>.XXXX.part``): whoever holds
    the lock (of ``path``, or of the folder a command writes it in) is the only live writer, so
    any such file is garbage."""
    name, manifest = (glob_escape(_stem(n)) for n in (path.name, f"{path.name}.manifest.json"))
    for pattern in (f".{name}.{'?' * 8}.part", f".{name}.{'?' * 8}.old",
                    f".{manifest}.{'?' * 8}.part"):
        _remove_matching(_parent(path), pattern)


def _remove_matching(folder: Path, pattern: str) -> None:
    for stale in folder.glob(pattern):
        with contextlib.suppress(OSError):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink()


def glob_escape(text: str) -> str:
    """Escape glob metacharacters in a literal file name part."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


_HELD: dict[str, int] = {}  # lock files this process holds -> how many holders


@contextlib.contextmanager
def output_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock for writing ``path``, a file or a folder (``.<name>.lock``
    beside it; a long name's lock carries a hash of the whole name).

    A second writer of the same output fails at once with a one-line error; the lock file is
    removed when the writer finishes (or dies: the kernel releases the lock with the process).
    The holder may take it again (a command locks what its library calls lock too).
    """
    path = Path(path)
    if path.name in ("", ".", ".."):  # a folder given as "." locks under its own name
        path = path.resolve()
    check_path_text(path)
    lock = _hidden(path, ".lock")
    key = os.path.abspath(lock)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    fd = _acquire(path, lock)
    _HELD[key] = 1
    remove_stale(path)
    try:
        yield
    finally:
        del _HELD[key]
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


@contextlib.contextmanager
def writing(folder: Path, outputs: Iterable[Path],
            inputs: Iterable[Path | str | None] = ()) -> Iterator[None]:
    """The block of a command that writes ``outputs`` into ``folder``: ``inputs`` declared
    (:func:`reading`), the folder locked (:func:`output_lock`: one writer), then no output may
    be an input (:func:`check_not_input`), checked under the lock."""
    with reading(inputs), output_lock(folder):
        check_not_input(outputs)
        yield


def _acquire(path: Path, lock: Path) -> int:
    """The locked descriptor of ``lock`` (a one-line error when another process holds it)."""
    import fcntl

    try:
        _parent(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create folder {_parent(path)}: {exc.strerror}") from None
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise UserError(f"cannot lock {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"another process is writing {path} (lock {lock}); wait for it to "
                            "finish or stop it") from None
        mine = os.fstat(fd)
        try:
            now = os.stat(lock)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)  # the previous holder removed the file between our open and lock: retry
