"""mmdatagen merge: shards join into the single-process bytes; foreign shards are refused."""
from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

SMALL = ["--image-size", "48x32", "--text-tokens", "20", "--image-content", "noise",
         "--image-format", "png", "-q"]
CASES = {
    "pool-files": ("pool", ["-n", 23, "--pool-size", 7, "--images-per-request", 2, "--image-uuids"]),
    "pool-inline": ("pool", ["-n", 19, "--pool-size", 5, "--delivery", "data-url"]),
    "sw-single": ("sliding-window", ["--users", 3, "--turns", 4, "--window", 2,
                                     "--delivery", "data-url"]),
    "sw-multi": ("sliding-window", ["--users", 5, "--turns", 3, "--window", 2, "--format",
                                    "multi_turn", "--order", "random", "--image-uuids"]),
}


def generate(run_cli, kind, out: Path, images: Path, *args) -> Path:
    result = run_cli(kind, "-o", out, "--image-dir", images, *SMALL, *args)
    assert result.exit_code == 0, result.output
    return Path(result.output.strip().splitlines()[-1])


def shards(run_cli, kind, folder: Path, images: Path, n: int, *args) -> list[Path]:
    return [generate(run_cli, kind, folder / "d.jsonl", images, "--shard-index", k,
                     "--num-shards", n, *args) for k in range(n)]


def manifest(path: Path) -> Path:
    return Path(str(path) + ".manifest.json")


@pytest.mark.parametrize("case", list(CASES))
def test_merged_equals_single_process(run_cli, tmp_path, case):
    kind, args = CASES[case]
    full = generate(run_cli, kind, tmp_path / "one" / "d.jsonl", tmp_path / "img", *args)
    parts = shards(run_cli, kind, tmp_path / "sh", tmp_path / "img", 3, *args)
    result = run_cli("merge", *reversed(parts), "-q")
    assert result.exit_code == 0, result.output
    merged = Path(result.output.strip())
    assert merged == tmp_path / "sh" / "d.jsonl"
    assert merged.read_bytes() == full.read_bytes()
    assert manifest(merged).read_bytes() == manifest(full).read_bytes()


def test_merge_finds_shards_beside_output(run_cli, tmp_path):
    kind, args = CASES["pool-files"]
    full = generate(run_cli, kind, tmp_path / "one" / "d.jsonl", tmp_path / "img", *args)
    shards(run_cli, kind, tmp_path / "sh", tmp_path / "img", 4, *args)
    out = tmp_path / "sh" / "d.jsonl"
    assert run_cli("merge", "-o", out).exit_code == 0
    assert out.read_bytes() == full.read_bytes()
    assert manifest(out).read_bytes() == manifest(full).read_bytes()
    again = run_cli("merge", "-o", out)
    assert again.exit_code == 2 and "exists" in again.output
    assert run_cli("merge", "-o", out, "--force", "-q").exit_code == 0


def refused(run_cli, *args) -> str:
    result = run_cli("merge", "-o", Path(args[0]).parent / "merged.jsonl", *args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert not (Path(args[0]).parent / "merged.jsonl").exists()
    return result.output


@pytest.fixture
def three(run_cli, tmp_path) -> list[Path]:
    return shards(run_cli, "pool", tmp_path / "a", tmp_path / "img", 3, "-n", 12, "--pool-size", 4)


def test_refuses_missing_and_duplicate_shards(run_cli, tmp_path, three):
    assert "missing shard(s) 1 of 3" in refused(run_cli, three[0], three[2])
    copy = tmp_path / "a" / "copy.shard-00000-of-00003.jsonl"
    shutil.copy(three[0], copy)
    shutil.copy(manifest(three[0]), manifest(copy))
    assert "duplicate shard 0" in refused(run_cli, three[0], copy, *three[1:])


def test_refuses_other_params_seed_count_and_version(run_cli, tmp_path, three):
    other = shards(run_cli, "pool", tmp_path / "b", tmp_path / "img", 3, "-n", 12, "--pool-size", 5)
    assert "different params (pool_size)" in refused(run_cli, three[0], other[1], three[2])
    seeded = shards(run_cli, "pool", tmp_path / "c", tmp_path / "img", 3, "-n", 12, "--pool-size", 4,
                    "--seed", 9)
    assert "different params (seed)" in refused(run_cli, three[0], seeded[1], three[2])
    four = shards(run_cli, "pool", tmp_path / "d", tmp_path / "img", 4, "-n", 12, "--pool-size", 4)
    assert "one of 4 shards" in refused(run_cli, *three[:2], four[2])
    data = orjson.loads(manifest(three[1]).read_bytes())
    data["mmdatagen_version"] = "0.0.0"
    manifest(three[1]).write_bytes(orjson.dumps(data))
    assert "different version" in refused(run_cli, *three)


def test_refuses_truncated_shard_and_no_manifest(run_cli, tmp_path, three):
    body = three[1].read_bytes()
    three[1].write_bytes(body[: body.index(b"\n") + 1])
    assert "has 1 lines, its manifest says" in refused(run_cli, *three)
    manifest(three[2]).unlink()
    assert "has no manifest" in refused(run_cli, *three)


def test_unsharded_file_needs_an_output_name(run_cli, tmp_path):
    plain = generate(run_cli, "pool", tmp_path / "plain.jsonl", tmp_path / "img", "-n", 3,
                     "--pool-size", 2)
    result = run_cli("merge", plain)
    assert result.exit_code == 2 and "not a shard file name" in result.output


def test_no_shards_found(run_cli, tmp_path):
    result = run_cli("merge", "-o", tmp_path / "none.jsonl")
    assert result.exit_code == 2 and "no shards of" in result.output


def test_nothing_to_merge_names_the_flag(run_cli):
    result = run_cli("merge")
    assert result.exit_code == 2 and "give shard files, or --output" in result.output
    assert result.output.count("\n") == 1
