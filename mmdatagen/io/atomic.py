"""Write-then-rename helpers: a target path holds either nothing or a complete file."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ..errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def check_target(path: Path, force: bool) -> None:
    """Refuse to overwrite without ``force``; fail early when the folder cannot be written."""
    if path.exists() and not force:
        raise UserError(f"{path} exists; pass --force to overwrite")
    if path.is_dir():
        raise UserError(f"{path} is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create folder {parent}: {exc.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"cannot write to folder {parent}")


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``path``; rename it over ``path`` only on success."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent or ".")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
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
