"""Class 2, stale, foreign or concurrent files: a manifest is trusted only for its own JSONL,
shards are verified by hash, one writer per output, image folders swap whole, and no command
writes over its input or over an existing file without --force."""
from __future__ import annotations

import shutil
import signal
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.io.manifest import (
    ContentHash,
    ImageEntry,
    Manifest,
    ShardInfo,
    read_manifest,
)

from .helpers import listing, one_error_line, run, start, wait_until

TINY = ["--image-size", "32x24", "--image-content", "noise", "--image-format", "png",
        "--text-tokens", "8", "--tokenizer", "words", "-q"]


def _pool(tmp_path, out, *args, **kw):
    res = run("pool", "-o", out, *TINY, *args, cwd=tmp_path, **kw)
    assert res.returncode == 0, res.stderr
    return tmp_path / out


def test_analyze_refuses_a_manifest_of_another_or_changed_file(tmp_path):
    big = _pool(tmp_path, "big.jsonl", "-n", 100, "--pool-size", 100)
    small = _pool(tmp_path, "small.jsonl", "-n", 100, "--pool-size", 10)
    # a 100-image pool's JSONL with a 10-image pool's manifest (was: 90 % best hit rate, exit 0)
    shutil.copy(f"{small}.manifest.json", f"{big}.manifest.json")
    res = run("analyze", big, "--cache-images", 10, cwd=tmp_path)
    assert res.returncode == 2 and "does not belong to" in one_error_line(res.stderr)
    # a 50-row file with its 100-row manifest (was: 100 requests reported)
    lines = small.read_bytes().splitlines(keepends=True)
    small.write_bytes(b"".join(lines[:50]))
    res = run("analyze", small, "--cache-images", 10, cwd=tmp_path)
    assert res.returncode == 2 and "does not belong to" in one_error_line(res.stderr)
    # same size, one byte changed
    small.write_bytes(b"".join(lines))
    data = bytearray(small.read_bytes())
    data[10] ^= 1
    small.write_bytes(bytes(data))
    res = run("analyze", small, "--cache-images", 10, cwd=tmp_path)
    assert "same size, different content" in one_error_line(res.stderr)
    # the documented way out: scan the JSONL itself
    assert run("analyze", small, "--no-manifest", "--cache-images", 10, cwd=tmp_path).returncode == 0


def test_merge_refuses_a_shard_with_a_corrupted_byte(tmp_path):
    for k in (0, 1):
        _pool(tmp_path, "d.jsonl", "-n", 40, "--pool-size", 10, "--num-shards", 2,
              "--shard-index", k, "--delivery", "data-url")
    shard = tmp_path / "d.shard-00001-of-00002.jsonl"
    data = bytearray(shard.read_bytes())
    i = data.index(b"base64,") + 20
    data[i] = ord("A") if data[i] != ord("A") else ord("B")  # same line count, same size
    shard.write_bytes(bytes(data))
    res = run("merge", "-o", "d.jsonl", cwd=tmp_path)
    assert res.returncode == 2 and "does not match its manifest" in one_error_line(res.stderr)
    assert not (tmp_path / "d.jsonl").exists()
    assert not [n for n in listing(tmp_path) if n.endswith((".part", ".lock"))]


def test_two_writers_of_one_output_one_gets_a_one_line_error(tmp_path):
    args = ["pool", "-o", "p.jsonl", "-n", 3000, "--pool-size", 3000, *TINY]
    first = start(*args, "--seed", 1, cwd=tmp_path)
    try:
        wait_until(lambda: (tmp_path / ".p.jsonl.lock").exists() or first.poll() is not None,
                   60, "the first writer's lock")
        first.send_signal(signal.SIGSTOP)  # held mid-run: the second one meets it still writing
        assert first.poll() is None, first.stderr.read().decode()
        second = run(*args, "--seed", 2, "--force", cwd=tmp_path)
        first.send_signal(signal.SIGCONT)
        assert first.wait(120) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 2
    assert "another process is writing" in one_error_line(second.stderr)
    manifest = read_manifest(tmp_path / "p.jsonl")  # verifies the JSONL against it
    assert manifest.seed == 1
    files = sorted((tmp_path / "p_images").iterdir())
    assert len(files) == 3000
    import blake3
    by_name = {f"{e.id:06d}.png": e.blake3 for e in manifest.images}
    assert all(blake3.blake3(f.read_bytes()).hexdigest() == by_name[f.name] for f in files)


def test_force_over_a_larger_run_leaves_no_extra_images(tmp_path):
    _pool(tmp_path, "p.jsonl", "-n", 30, "--pool-size", 30)
    res = run("pool", "-o", "p.jsonl", "-n", 10, "--pool-size", 10, *TINY, cwd=tmp_path)
    assert res.returncode == 2 and "--force" in one_error_line(res.stderr)
    _pool(tmp_path, "p.jsonl", "-n", 10, "--pool-size", 10, "--force")
    assert len(list((tmp_path / "p_images").iterdir())) == 10
    assert [n for n in listing(tmp_path) if n.startswith(".")] == []


def test_bench_never_writes_over_its_input(tmp_path, small_dataset):
    folder = tmp_path / "d"
    folder.mkdir()
    data = folder / "records.jsonl"
    shutil.copy(small_dataset, data)
    before = data.read_bytes()
    res = run("bench", "--input-file", data, "--output-dir", folder, "--request-count", 2, "-q",
              cwd=tmp_path)
    assert res.returncode == 2 and "is an input of this run" in one_error_line(res.stderr)
    assert data.read_bytes() == before


def test_analyze_curve_never_overwrites_an_input_or_an_existing_file(tmp_path, small_dataset):
    manifest = Path(f"{small_dataset}.manifest.json")
    before = manifest.read_bytes()
    res = run("analyze", small_dataset, "--curve", manifest, cwd=tmp_path)
    assert res.returncode == 2 and "is an input of this run" in one_error_line(res.stderr)
    assert manifest.read_bytes() == before
    other = tmp_path / "c.json"
    other.write_text("mine")
    res = run("analyze", small_dataset, "--curve", other, cwd=tmp_path)
    assert res.returncode == 2 and "--force" in one_error_line(res.stderr)
    assert other.read_text() == "mine"
    res = run("analyze", small_dataset, "--curve", other, "--force", cwd=tmp_path)
    assert res.returncode == 0 and "curve" in orjson.loads(other.read_bytes())


ids = st.integers(0, 10**6)
entries = st.builds(ImageEntry, ids, st.one_of(st.none(), st.text(max_size=8)), st.integers(1, 9999),
                    st.integers(1, 9999), st.integers(0, 10**9), st.text("0123456789abcdef", max_size=8))


@settings(max_examples=60, deadline=None)
@given(images=st.lists(entries, max_size=5), rows=st.lists(st.lists(ids, max_size=3), max_size=5),
       start=st.integers(0, 100), seed=st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)))
def test_manifest_round_trips_through_its_dict(images, rows, start, seed):
    m = Manifest(kind="pool", format="single_turn", params={"a": 1}, seed=seed,
                 shard=ShardInfo(0, 1, (start, start + len(rows)), start + len(rows)),
                 delivery="path", images=images, rows=rows,
                 jsonl=ContentHash(10, len(rows), "ab" * 32))
    again = Manifest.from_dict(orjson.loads(orjson.dumps(m.to_dict())))
    assert again == m and list(again.to_dict()) == list(m.to_dict())
