"""End to end against the embedded simulator: no --url, cache evidence, fault injection."""
from __future__ import annotations

import base64
import io

import numpy as np
from loadgen_helpers import make_run, write_jsonl

from mmdatagen.loadgen.run import run_bench


def _dataset(tmp_path, n=40, distinct=8):
    from PIL import Image

    rng = np.random.default_rng(0)
    urls = []
    for _ in range(distinct):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    rows = [{"text": "describe " * 20, "image": urls[i if i < distinct else int(rng.integers(distinct))]}
            for i in range(n)]
    return write_jsonl(tmp_path / "d.jsonl", rows)


def _cfg(path, out, **kw):
    base = dict(input_file=path, model="Qwen/Qwen3-VL-30B-A3B-Instruct-FP8", url=None,
                profile="zero-delay", cache_gb=1.0, concurrency=4, streaming=True,
                warmup_request_count=2, output_dir=out, quiet=True,
                extra_inputs={"max_tokens": 5},
                encoder_budget=70)  # vLLM's encoder cache in front of Dynamo's: one image
    base.update(kw)
    return make_run(**base)


def test_embedded_run_predicted_matches_measured(tmp_path):
    res = run_bench(_cfg(_dataset(tmp_path), tmp_path / "o"))
    ex = res.export
    assert ex["request_count"]["avg"] == 38 and ex["error_request_count"]["avg"] == 0
    cache = ex["image_cache"]
    measured, predicted = cache["measured"], cache["predicted"]
    # Dynamo's connector is asked only where the encoder cache in front misses
    front = cache["server_metrics"].get("encoder_hits", 0)
    looked = measured["hits"] + measured["misses"]
    assert 38 - front <= looked < 38 and measured["hits"] > 0
    assert predicted["hits"] == measured["hits"] and predicted["references"] == looked
    assert cache["server_metrics"]["queries"] + front == 40  # /metrics includes warmup
    assert all(r.server_ttft_ns is not None for r in res.records)
    assert ex["client_added_ttft"]["count"] == 38


def test_fault_injection_every_request_accounted(tmp_path):
    sim = ["--fault-error-rate", "0.25", "--fault-disconnect-rate", "0.25",
           "--fault-malformed-rate", "0.25", "--fault-seed", "3"]
    res = run_bench(_cfg(_dataset(tmp_path, n=60), tmp_path / "o", sim_args=sim,
                         extra_inputs={"max_tokens": 8}))
    assert len(res.records) == 60
    kinds = {r.error["type"] for r in res.records if r.error}
    assert kinds and kinds <= {"HTTPError", "ConnectionReset", "MalformedStream"}
    ex = res.export
    assert ex["request_count"]["avg"] + ex["error_request_count"]["avg"] == 58
    assert sum(e["count"] for e in ex["error_summary"]) == ex["error_request_count"]["avg"]


def test_stall_before_first_token_times_out(tmp_path):
    sim = ["--fault-stall-first-rate", "1.0", "--fault-stall-ms", "3000"]
    res = run_bench(_cfg(_dataset(tmp_path, n=4, distinct=4), tmp_path / "o", sim_args=sim,
                         request_timeout=0.3, warmup_request_count=0))
    assert [r.error["type"] for r in res.records] == ["Timeout"] * 4
