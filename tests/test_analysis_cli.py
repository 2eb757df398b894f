"""``mmdatagen analyze`` end to end: reports, JSON, sweeps, curve files, plots, errors."""
import csv
import json
import re
import sys

import pytest

from mmdatagen.analysis.predict import GIB

ENTRY = 10_444_800
PLAIN = ("--cache", "dynamo-encode", "--insert", "schedule")  # a byte LRU, nothing in front


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _error(result, pattern):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and pattern in lines[-1], result.output
    assert "Traceback" not in result.output


def test_report_from_workload_has_every_number(run_cli):
    out = run_cli("analyze", "--workload", "sliding-window", "--cache-gb", "10",
                  "--cache-images", "148,149")
    assert out.exit_code == 0, out.output
    text = out.output
    # Dynamo's two tiers: vLLM's encoder cache (16,384 tokens: one request's 5 images) never
    # holds a user's images until the next turn, 29 requests later: every reference asks Dynamo
    for needle in ("Dynamo lookups         1,200", "distinct images        360",
                   "served 0 of 1,200 references",
                   "compulsory misses      360", "best possible hit rate 70.0 %", "90 % of best",
                   "100 % of best (840 hits) needs 1.449 GiB or 149 images"):
        assert needle in text, text
    assert re.search(r"148 images +148 +0\.0 %", text) and re.search(r"149 images +149 +70\.0 %", text)
    assert re.search(r"10 GiB +1,028 +70\.0 %", text)  # a 10 GiB cache holds 1,028 entries


def test_json_and_real_width(run_cli):
    base = _json(run_cli("analyze", "--workload", "sliding-window", "--json"))
    wide = _json(run_cli("analyze", "--workload", "sliding-window", "--json", "--real-width"))
    assert base["thresholds"][-1]["capacity_bytes"] == 149 * ENTRY
    assert wide["thresholds"][-1]["capacity_bytes"] == 4 * 149 * ENTRY
    assert base["best"]["tokens_saved"] == 840 * 2550


def test_generic_model(run_cli):
    s = _json(run_cli("analyze", "--workload", "pool", "--tokens-per-image", "100",
                      "--bytes-per-token", "10", "--cache-gb", str(200 * 1000 / GIB), "--json",
                      *PLAIN))
    assert s["entry_bytes"]["max"] == 1000 and s["capacities"][0]["hit_rate"] == pytest.approx(0.8)


def test_sweep_over_pool_sizes_and_ranges(run_cli):
    out = _json(run_cli("analyze", "--workload", "pool", "--pool-size", "100:300:100",
                        "--cache-gb", "0:0.2:0.1", "--json", *PLAIN))
    assert [s["workload"]["pool_size"] for s in out] == [100, 200, 300]
    assert [s["best"]["hit_rate"] for s in out] == pytest.approx([0.9, 0.8, 0.7])
    assert [c["capacity_gib"] for c in out[0]["capacities"]] == pytest.approx([0, 0.1, 0.2])
    text = run_cli("analyze", "--workload", "pool", "--pool-size", "100,200", "--cache-gb", "1",
                   *PLAIN)
    lines = text.output.strip().splitlines()
    assert len(lines) == 3 and "pool_size=100" in lines[1] and "90.0 %" in lines[1]


def test_seed_sweep_shows_spread(run_cli):
    out = _json(run_cli("analyze", "--workload", "pool", "--reuse", "uniform", "--seed", "0:2",
                        "--cache-gb", "0.1", "--json"))
    assert [s["workload"]["seed"] for s in out] == [0, 1, 2]
    assert len({s["capacities"][0]["hits"] for s in out}) > 1


def test_curve_csv_and_json_match_the_report(run_cli, tmp_path):
    csv_path, json_path = tmp_path / "c.csv", tmp_path / "c.json"
    s = _json(run_cli("analyze", "--workload", "pool", "--reuse", "zipf", "--cache-gb", "0.1",
                      "--curve", csv_path, "--json"))
    rows = list(csv.DictReader(csv_path.open()))
    caps = [int(r["capacity_bytes"]) for r in rows]
    assert caps == sorted(set(caps)) and len(rows) > 10
    at = [r for r in rows if int(r["capacity_bytes"]) <= 0.1 * GIB][-1]
    assert int(at["hits"]) == s["capacities"][0]["hits"]
    assert float(rows[-1]["hit_rate"]) == pytest.approx(s["best"]["hit_rate"])
    run_cli("analyze", "--workload", "pool", "--reuse", "zipf", "--curve", json_path)
    doc = json.loads(json_path.read_text())
    assert doc["curve"]["capacity_bytes"] == caps
    assert doc["curve"]["hits"] == [int(r["hits"]) for r in rows]
    assert doc["sampled"] is False and doc["summary"]["distinct_images"] == s["distinct_images"]


def test_plot_is_written_and_missing_matplotlib_is_one_line(run_cli, tmp_path, monkeypatch):
    png = tmp_path / "p.png"
    assert run_cli("analyze", "--workload", "pool", "--cache-gb", "0.1", "--plot", png).exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    _error(run_cli("analyze", "--workload", "pool", "--plot", tmp_path / "q.png"), "matplotlib")


def _generate(run_cli, tmp_path, *extra):
    out = tmp_path / "ds.jsonl"
    res = run_cli("pool", "-n", "60", "--pool-size", "12", "--image-size", "64x48,96x64",
                  "--text-tokens", "5", "--tokenizer", "words", "--quiet", "-o", out, *extra)
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("delivery", ["path", "data-url"])
def test_manifest_and_full_scan_agree_on_generated_datasets(run_cli, tmp_path, delivery):
    ds = _generate(run_cli, tmp_path, "--delivery", delivery, "--reuse", "uniform")
    args = ["analyze", ds, "--cache-images", "3:12:3", "--cache-gb", "0.001", "--json"]
    fast = _json(run_cli(*args))
    slow = _json(run_cli(*args, "--no-manifest"))
    assert fast["info"]["manifest"] is True and slow["info"]["manifest"] is False
    for key in ("references", "distinct_images", "best", "capacities", "thresholds",
                "distinct_bytes"):
        assert fast[key] == slow[key], key


def test_sessions_dispatch_on_a_generated_sliding_window(run_cli, tmp_path):
    ds = tmp_path / "sw.jsonl"
    res = run_cli("sliding-window", "--users", "6", "--turns", "4", "--window", "3",
                  "--image-size", "64x48", "--text-tokens", "5", "--tokenizer", "words",
                  "--quiet", "-o", ds)
    assert res.exit_code == 0, res.output
    # 6 users turn-major: 2 in flight inserted at completion still sees the previous turn
    causal = _json(run_cli("analyze", ds, "--cache", "dynamo-encode", "--dispatch", "sessions",
                           "--in-flight", "2", "--cache-images", "1000", "--json"))
    blind = _json(run_cli("analyze", ds, "--cache", "dynamo-encode", "--in-flight", "12",
                          "--cache-images", "1000", "--json"))
    assert causal["capacities"][0]["hit_rate"] == pytest.approx(causal["best"]["hit_rate"])
    assert causal["best"]["hits"] == 6 * 3 * 2  # every turn after the first reuses 2 images
    assert blind["best"]["hits"] < causal["best"]["hits"]


def test_generator_presets_give_the_seed_workloads(run_cli):
    b = _json(run_cli("analyze", "--config", "qwen3.6-sliding-window", "--json"))
    assert b["references"] == 1200 and b["best"]["hits"] == 840
    assert "preset qwen3.6-sliding-window" in b["source"]
    a = _json(run_cli("analyze", "--config", "qwen3-vl-30b-pool200", "--pool-size", "100",
                      "--json"))
    assert a["front"]["references"] == 1000 and a["distinct_images"] == 100  # flags override
    assert a["entry_bytes"]["max"] == 300 * 4096  # the preset's 640x480 images


BAD = [
    (["analyze", "--config", "qwen3-vl-30b-pool200", "--workload", "sliding-window"], "not"),
    (["analyze", "--config", "no-such-preset"], "cannot find config"),
    (["analyze"], "--workload or a DATASET"),
    (["analyze", "missing.jsonl"], "not found"),
    (["analyze", "--workload", "pool", "--cache-gb", "a:b"], "--cache-size"),  # the alias names its flag
    (["analyze", "--workload", "pool", "--cache-gb", "-1"], "negative"),
    (["analyze", "--workload", "pool", "--cache-gb", "5:1"], "empty"),
    (["analyze", "--workload", "pool", "--cache-images", "1.5"], "--cache-images"),
    (["analyze", "--workload", "pool", "--model", "gpt-vision"], "unknown model"),
    (["analyze", "--workload", "pool", "--tokens-per-image", "5"], "go together"),
    (["analyze", "--workload", "pool", "--pool-size", "0"], "pool-size"),
    (["analyze", "--workload", "pool", "--pool-size", "5,6", "--curve", "x.csv"], "sweep"),
    (["analyze", "--workload", "pool", "--curve", "x.txt"], ".csv or .json"),
    (["analyze", "--workload", "pool", "--in-flight", "0"], "in-flight"),
    (["analyze", "--workload", "pool", "--cache", "dynamo-embedding", "--register", "completion"],
     "its --register and --oversize rules are fixed"),
    (["analyze", "--workload", "pool", "--cache", "vllm-processor", "--encoder-budget", "100"],
     "--cache vllm-processor has none"),
    (["analyze", "--workload", "sliding-window", "--image-size", "12by12"], "image size"),
    (["analyze", "--workload", "pool", "--users", "3"], "does not apply"),
    (["analyze", "--workload", "pool", "--pool-size", "1:100000000"], "100,000"),
]


@pytest.mark.parametrize("args,pattern", BAD)
def test_bad_input_is_one_line_exit_2(run_cli, tmp_path, monkeypatch, args, pattern):
    monkeypatch.chdir(tmp_path)
    _error(run_cli(*args), pattern)


def test_dataset_errors_are_one_line(run_cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"image": "https://x/y.jpg"}\n')
    _error(run_cli("analyze", bad), "url-image-size")
    assert run_cli("analyze", bad, "--url-image-size", "640x480").exit_code == 0
    bad.write_text("not json\n")
    _error(run_cli("analyze", bad), "not valid JSON")
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"image": "https://x/y.jpg"}\n')
    _error(run_cli("analyze", ds, "--pool-size", "3"), "applies to --workload")


@pytest.mark.parametrize("key", ["bytes", "uuid", "reference"])
def test_multi_turn_manifest_and_scan_agree(run_cli, tmp_path, key):
    ds = tmp_path / "mt.jsonl"
    res = run_cli("sliding-window", "--users", "4", "--turns", "3", "--window", "2",
                  "--image-size", "64x48", "--text-tokens", "5", "--tokenizer", "words", "-q",
                  "--format", "multi_turn", "--delivery", "data-url", "--image-uuids", "-o", ds)
    assert res.exit_code == 0, res.output
    args = ["analyze", ds, "--key", key, "--cache-images", "1:6", "--json"]
    fast, slow = _json(run_cli(*args)), _json(run_cli(*args, "--no-manifest"))
    assert slow["info"]["image_uuids"] is True
    report = run_cli("analyze", ds, "--no-manifest", "--key", key).output
    assert ("note: rows carry image_uuids" in report) == (key != "uuid")
    # every turn resends the session's history (vLLM's encoder cache, in front of Dynamo's,
    # serves some of the resent images)
    assert fast["front"]["references"] == 4 * (2 + 4 + 6)
    assert fast["references"] == 4 * (2 + 4 + 6) - fast["front"]["hits"]
    for k in ("references", "distinct_images", "best", "capacities", "thresholds"):
        assert fast[k] == slow[k], k
