"""Bad input: one clear line, exit code 2, no traceback, nothing left behind."""
from __future__ import annotations

import pytest
from conftest import run_subprocess

BAD = [
    ["pool", "--pool-size", "2", "--images-per-request", "3"],
    ["pool", "--num-requests", "0"],
    ["pool", "--num-requests", "-5"],
    ["pool", "--num-requests", "abc"],
    ["pool", "--tokenizer", "no-such-tokenizer"],
    ["pool", "--config", "missing.yaml"],
    ["pool", "--config", "bad.yaml"],
    ["pool", "--config", "unknown_key.yaml"],
    ["pool", "--image-size", "100000x100000"],
    ["pool", "--image-size", "12by12"],
    ["pool", "--delivery", "url"],
    ["pool", "--image-content", "folder"],
    ["pool", "--shared-prefix-tokens", "500"],
    ["pool", "--target-reuse", "1.5"],
    ["pool", "--shard-index", "3", "--num-shards", "2"],
    ["pool", "--output", "notadir/out.jsonl"],
    ["pool", "--output", "notadir/sub/out.jsonl", "--image-dir", "notadir/img"],
    ["sliding-window", "--users", "0"],
    ["sliding-window", "--window", "-1"],
    ["sliding-window", "--shared-fraction", "2"],
    ["pool", "--target-bytes", "10", "--image-format", "png"],
]


@pytest.mark.parametrize("args", BAD, ids=[" ".join(a) for a in BAD])
def test_bad_input_is_one_line_exit_2(tmp_path, args):
    (tmp_path / "bad.yaml").write_text("num_requests: [1, 2\n")
    (tmp_path / "unknown_key.yaml").write_text("num_requests: 5\ncolour: blue\n")
    (tmp_path / "notadir").write_text("a file where a folder is expected (root ignores modes)")
    before = set(tmp_path.rglob("*"))
    proc = run_subprocess(*args, "--image-size", "16x16", "--text-tokens", "5", cwd=tmp_path) \
        if "--image-size" not in args and "--shared-prefix-tokens" not in args \
        else run_subprocess(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    leftovers = {p for p in set(tmp_path.rglob("*")) - before}
    assert not [p for p in leftovers if p.suffix in (".jsonl", ".json", ".part")], leftovers


def test_existing_output_needs_force(tmp_path):
    args = ["pool", "-n", "3", "--pool-size", "2", "--image-size", "8x8", "--text-tokens", "3",
            "-o", "d.jsonl", "-q"]
    assert run_subprocess(*args, cwd=tmp_path).returncode == 0
    proc = run_subprocess(*args, cwd=tmp_path)
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert run_subprocess(*args, "--force", cwd=tmp_path).returncode == 0


def test_help_and_version():
    top = run_subprocess("--help")
    assert top.returncode == 0 and "pool" in top.stdout and "sliding-window" in top.stdout
    for command in ("pool", "sliding-window"):
        assert run_subprocess(command, "--help").returncode == 0
    assert "0.1.0" in run_subprocess("--version").stdout
