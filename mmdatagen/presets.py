"""Find shipped presets and profiles (``configs/``) by name or path, and load YAML configs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import UserError


def configs_dir() -> Path:
    """``configs/`` as installed in the package (``mmdatagen/configs``), else the source checkout's."""
    here = Path(__file__).resolve().parent
    installed = here / "configs"
    return installed if installed.is_dir() else here.parent / "configs"


def find_config(name_or_path: str, subdir: str = "") -> Path:
    """A path as given when it exists, else ``configs/<subdir>/<name>[.yaml]`` from the package."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    base = configs_dir() / subdir
    for candidate in (base / name_or_path, base / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in base.glob("*.yaml")) if base.is_dir() else []
    hint = f"; shipped: {', '.join(known)}" if known else ""
    raise UserError(f"cannot find config {name_or_path!r}{hint}")


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from a file, with one-line errors for unreadable or malformed files."""
    import yaml

    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise UserError(f"cannot read config {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"config {path} is not a text (UTF-8 YAML) file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UserError(f"config {path} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config {path} must be a mapping of option names to values")
    return data
