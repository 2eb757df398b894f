"""The sidecar manifest (``<output>.manifest.json``): parameters, images, rows, without pixels."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..errors import DatasetError
from .atomic import atomic_write_bytes

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1


def manifest_path(jsonl_path: Path) -> Path:
    """``data.jsonl`` -> ``data.jsonl.manifest.json``."""
    jsonl_path = Path(jsonl_path)
    return jsonl_path.with_name(jsonl_path.name + MANIFEST_SUFFIX)


def write_manifest(jsonl_path: Path, manifest: dict[str, Any]) -> Path:
    """Write the manifest beside its dataset, atomically; returns its path."""
    path = manifest_path(jsonl_path)
    atomic_write_bytes(path, orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE))
    return path


def read_manifest(jsonl_path: Path) -> dict[str, Any] | None:
    """The manifest of a dataset written by mmdatagen, or None when there is none."""
    path = manifest_path(jsonl_path)
    if not path.is_file():
        return None
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise DatasetError(f"cannot read manifest {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("manifest_version") != MANIFEST_VERSION:
        raise DatasetError(f"{path} is not an mmdatagen manifest (version {MANIFEST_VERSION})")
    return data
