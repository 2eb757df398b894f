"""What a sweep folder was made from, so that a rerun resumes only the same sweep.

A sweep writes ``sweep.origin.json`` before its first run: the dataset's BLAKE3 digest, the
target (embedded simulator, virtual time or a URL) and every setting of its runs (the base
benchmark config; the grid and the repeats are not part of it, so a rerun may add points or
repeats and still resume the runs it shares), then the runs finished under it. A rerun into the
folder resumes only when all of that matches, and only those runs; anything else (another
dataset, another request count, a folder of runs without an origin) is refused with one line
naming ``--force``, which runs every point again.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import SpecError
from ..metrics import EXPORT_NAME
from .shard import file_digest

if TYPE_CHECKING:
    from ..settings.run import BenchRun

ORIGIN_NAME = "sweep.origin.json"
ORIGIN_VERSION = 1
# settings that may change between a sweep and its resume: where things are, how verbose, and
# the goodput objectives (a resumed run's goodput is recomputed from its records)
NOT_COMPARED = ("input_file", "output_dir", "quiet", "goodput")


def sweep_origin(base: BenchRun, virtual: bool) -> dict[str, Any]:
    """The origin record of a sweep (its runs' base settings, virtual time or not), as JSON
    would give it back."""
    settings = {k: v for k, v in base.public().items() if k not in NOT_COMPARED}
    target = "virtual" if virtual else (base.target.url or "embedded")
    doc = {"mmdatagen_sweep_origin": ORIGIN_VERSION,
           "dataset_blake3": file_digest(base.load.input_file), "target": target,
           "settings": settings}
    return orjson.loads(orjson.dumps(doc))


class Origin:
    """A sweep folder's origin record: checked when the sweep starts (another sweep's folder is
    refused without ``--force``), then the list of runs finished under it, so a run resumes
    only when it was made by this very sweep (never a leftover of one ``--force`` replaced)."""

    def __init__(self, base: BenchRun, virtual: bool, force: bool, out: Path) -> None:
        self.path = out / ORIGIN_NAME
        self.want = sweep_origin(base, virtual)
        have = _read(self.path)
        runs = have.pop("runs", []) if have is not None else []
        if have is not None and have != self.want and not force:
            raise SpecError("force", f"is needed: {out} holds a sweep made from "
                                     f"{_difference(have, self.want)}; `force` runs every point "
                                     "again")
        if have is None and _has_runs(out) and not force:
            raise SpecError("force", f"is needed: {out} holds runs whose origin is not recorded "
                                     f"({ORIGIN_NAME}); `force` runs every point again")
        same = have == self.want and not force
        self.runs: list[str] = [r for r in runs if isinstance(r, str)] if same else []
        self._write()

    def resumable(self, run: str) -> bool:
        """``run`` (``<point>/r<k>``) was finished by this sweep."""
        return run in self.runs

    def done(self, run: str) -> None:
        if run not in self.runs:
            self.runs.append(run)
            self._write()

    def _write(self) -> None:
        from ..io.atomic import atomic_write_bytes

        atomic_write_bytes(self.path, orjson.dumps({**self.want, "runs": self.runs},
                                                   option=orjson.OPT_INDENT_2))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError):
        return {}  # unreadable: matches nothing
    return doc if isinstance(doc, dict) else {}


def _has_runs(out: Path) -> bool:
    return out.is_dir() and any(out.glob(f"*/r*/{EXPORT_NAME}"))


def _difference(have: dict[str, Any], want: dict[str, Any]) -> str:
    """The first difference, in words: what the folder's sweep was made from."""
    if have.get("dataset_blake3") != want["dataset_blake3"]:
        return "another dataset (its BLAKE3 digest differs)"
    if have.get("target") != want["target"]:
        return f"another target ({have.get('target')})"
    old = have.get("settings")
    if not isinstance(old, dict):
        return "an unreadable origin record"
    for key, value in want["settings"].items():
        if old.get(key) != value:
            return f"other settings ({key} {_short(old.get(key))}, now {_short(value)})"
    extra = sorted(set(old) - set(want["settings"]))
    return f"other settings ({extra[0] if extra else 'version'})"


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."
