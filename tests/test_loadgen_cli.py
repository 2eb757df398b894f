"""CLI level: SIGINT partial exports, compare table, user errors, and the embedded simulator."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import orjson
import pytest
from loadgen_helpers import Stub, write_jsonl

from mmdatagen.loadgen import compare as cmp


def _bench_cmd(*args):
    return [sys.executable, "-m", "mmdatagen", "bench", *map(str, args)]


@pytest.mark.parametrize("grace,expect_cancelled", [(10, False), (0, True)])
def test_sigint_writes_partial_exports(tmp_path, grace, expect_cancelled):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"r{i}"} for i in range(200)])
    out = tmp_path / "out"
    with Stub() as stub:
        proc = subprocess.Popen(
            _bench_cmd("--input-file", path, "--url", stub.url, "--model", "slow",
                       "--concurrency", 2, "--output-dir", out, "--grace-period", grace,
                       "--no-predict", "--quiet"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while len(stub.log) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        seen = len(stub.log)
    assert proc.returncode == 130, err
    doc = orjson.loads((out / "profile_export_mmdatagen.json").read_bytes())
    assert doc["was_cancelled"] is True and doc["is_complete"] is False
    lines = [orjson.loads(x) for x in (out / "records.jsonl").read_bytes().splitlines()]
    assert 4 <= len(lines) < 200
    assert len(lines) == seen  # every request the server saw is recorded: nothing dropped
    cancelled = [x for x in lines if (x["error"] or {}).get("type") == "Cancelled"]
    assert bool(cancelled) == expect_cancelled


def _export(tps, ttft, p50, p99, itl, lat, rps, hit=None):
    doc = {"output_token_throughput": {"unit": "tokens/sec", "avg": tps},
           "time_to_first_token": {"unit": "ms", "avg": ttft, "p50": p50, "p99": p99},
           "inter_token_latency": {"unit": "ms", "avg": itl},
           "request_latency": {"unit": "ms", "avg": lat},
           "request_throughput": {"unit": "requests/sec", "avg": rps}}
    if hit is not None:
        doc["image_cache"] = {"measured": {"hit_rate": hit}}
    return doc


def test_compare_table_matches_seed_shape(tmp_path, run_cli):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "profile_export_mmdatagen.json").write_bytes(orjson.dumps(
        _export(3575.6, 526.0, 356.8, 900.0, 14.1, 2630.0, 1.2, hit=0.8)))
    (b / "profile_export_aiperf.json").write_bytes(orjson.dumps(
        _export(3072.3, 727.5, 510.8, 1200.0, 15.5, 3035.7, 1.0)))
    res = run_cli("compare", a, b, "--labels", "Cache ON", "Cache OFF", "--output-dir", tmp_path)
    assert res.exit_code == 0, res.output
    assert "Cache ON" in res.output and "+16.4 %" in res.output and "-27.7 %" in res.output
    md = (tmp_path / "comparison.md").read_text()
    assert md.startswith("| Metric | Cache ON | Cache OFF | Delta |")
    assert "| TTFT p50 (ms) | 356.8 | 510.8 | -30.1 % |" in md
    assert "| ITL avg (ms) | 14.1 | 15.5 | -9.0 % |" in md
    assert "| Request latency avg (ms) | 2,630.0 | 3,035.7 | -13.4 % |" in md
    table = orjson.loads((tmp_path / "comparison.json").read_bytes())
    assert [r["metric"] for r in table["rows"]][:7] == [label for label, _, _ in cmp.ROWS]
    assert table["rows"][-1]["a"] == pytest.approx(80.0) and table["rows"][-1]["b"] is None


def test_compare_chart_png(tmp_path, run_cli):
    pytest.importorskip("matplotlib")
    for name in "ab":
        (tmp_path / f"{name}.json").write_bytes(orjson.dumps(_export(2, 3, 3, 4, 1, 5, 1)))
    res = run_cli("compare", tmp_path / "a.json", tmp_path / "b.json", "--chart",
                  "--output-dir", tmp_path / "cmp")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cmp" / "comparison.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args,message", [
    (["--input-file", "missing.jsonl", "--url", "http://127.0.0.1:9", "--model", "m"],
     "input file not found"),
    (["--input-file", "{data}", "--url", "http://127.0.0.1:9"], "--model is required"),
    (["--input-file", "{data}", "--url", "ftp://x", "--model", "m"], "--url must be"),
    (["--input-file", "{data}", "--url", "http://127.0.0.1:9", "--model", "m",
      "--extra-inputs", "oops"], "KEY:VALUE"),
    (["--input-file", "{data}", "--url", "http://127.0.0.1:9", "--model", "m",
      "--concurrency", "0"], "--concurrency"),
])
def test_user_errors_are_one_line(tmp_path, args, message):
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "q"}])
    args = [a.replace("{data}", str(data)) for a in args]
    proc = subprocess.run(_bench_cmd(*args, "--quiet"), capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_bad_dataset_row_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "q"}\nnot json\n')
    proc = subprocess.run(_bench_cmd("--input-file", bad, "--url", "http://127.0.0.1:9",
                                     "--model", "m", "--quiet"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ab_runs_twice_and_compares(tmp_path, run_cli):
    pytest.importorskip("mmdatagen.sim.embedded")
    import base64
    import io

    from PIL import Image

    urls = []
    for colour in ("red", "green", "blue"):
        buf = io.BytesIO()
        Image.new("RGB", (32, 32), colour).save(buf, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "q", "image": urls[i % 3]} for i in range(12)])
    out = tmp_path / "ab"
    # vLLM's encoder cache in front of Dynamo's holds one image here: the repeats reach Dynamo
    res = run_cli("ab", "--input-file", data, "--profile", "zero-delay", "--concurrency", "2",
                  "--extra-inputs", "max_tokens:4", "--output-dir", out, "--quiet",
                  "--sim-arg=--encoder-budget=70")
    assert res.exit_code == 0, res.output
    table = orjson.loads((out / "comparison.json").read_bytes())
    assert table["labels"] == ["Cache ON", "Cache OFF"]
    hit = table["rows"][-1]
    assert hit["metric"].startswith("Image cache hit rate")
    assert hit["a"] == pytest.approx(100.0) and hit["b"] == pytest.approx(0.0)  # 3 warmup misses
    for tag in "ab":
        doc = orjson.loads((out / tag / "profile_export_mmdatagen.json").read_bytes())
        assert doc["request_count"]["avg"] == 9 and doc["warmup_metrics"]["request_count"]["avg"] == 3
