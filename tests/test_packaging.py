"""Packaging: every package folder is listed in pyproject, configs ship inside the wheel."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mmdatagen").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {sorted(found - listed)}"


def test_presets_found_from_package():
    from mmdatagen.presets import configs_dir

    assert (configs_dir() / "qwen3-vl-30b-pool200.yaml").is_file()
