"""README's "By role" commands run as written (lines marked ``# needs`` are skipped)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def role_commands() -> list[list[str]]:
    """Every command line of the bash blocks in README's "By role" section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## By role\n", 1)[1].split("\n## ", 1)[0]
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for line in block.splitlines():
            if line.strip() and "# needs" not in line:
                lines.append(shlex.split(line, comments=True))
    return lines


def test_role_commands_are_found():
    commands = role_commands()
    assert len(commands) >= 8 and all(c[0] == "mmdatagen" for c in commands)
    assert {c[1] for c in commands} >= {"pool", "simulate", "bench", "compare", "analyze", "merge"}


@pytest.mark.slow
def test_role_commands_run_as_written(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for words in role_commands():
        proc = subprocess.run([sys.executable, "-m", "mmdatagen", *words[1:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{shlex.join(words)}\n{proc.stderr}"
    runs = tmp_path / "runs"
    assert (runs / "predicted" / "profile_export_mmdatagen.json").is_file()
    assert (runs / "embedded" / "records.jsonl").is_file()
    assert (runs / "small_hf").is_dir() and (runs / "small.parquet").is_file()
    shards = sorted(runs.glob("large.shard-*.jsonl"))
    assert len(shards) == 2
    assert (runs / "large.jsonl").read_bytes() == b"".join(p.read_bytes() for p in shards)
