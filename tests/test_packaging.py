"""Packaging: every package folder is listed in pyproject, configs ship inside the wheel."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mmdatagen").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {sorted(found - listed)}"


@pytest.mark.slow
def test_wheel_ships_every_config_and_finds_it_without_the_checkout(tmp_path):
    """Build the wheel from a copy of the sources, check every configs/ file is inside it, and
    resolve a preset and a profile from the unpacked wheel alone (no checkout fallback)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "mmdatagen", src / "mmdatagen", ignore=ignore)
    shutil.copytree(ROOT / "configs", src / "configs", ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("mmdatagen-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts]
    missing = [f for f in shipped if f"mmdatagen/configs/{f}" not in names]
    assert not missing, f"configs missing from the wheel: {missing}"
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("from mmdatagen.presets import configs_dir, find_config; import sys; "
             "print(configs_dir()); find_config('qwen3-vl-30b-pool200'); "
             "find_config('qwen3-vl-30b-gb200', 'profiles')")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, check=True, text=True,
                         capture_output=True, env={**os.environ, "PYTHONPATH": str(site)})
    assert Path(out.stdout.strip()) == site / "mmdatagen" / "configs"
