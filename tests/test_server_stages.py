"""Where a request's time goes on the server (the export's ``server_stages``): before the
scheduler, in its queue, scheduled to first token, first to last token. The simulator's engine
sums them; vLLM's request histograms give the same split; bench reads either from /metrics."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import fast_profile

from mmdatagen.loadgen.scrape import parse_metrics, stage_delta
from mmdatagen.metrics import STAGES
from mmdatagen.sim.virtual import OutputPolicy, load_turns, simulate


def _dataset(tmp: Path, n: int, words: int) -> Path:
    path = tmp / f"d{n}-{words}.jsonl"
    path.write_text("".join(json.dumps({"text": "word " * (words + i % 3)}) + "\n"
                            for i in range(n)))
    return path


def test_one_request_at_a_time_by_hand(tmp_path):
    """Concurrency 1, a 7 ms frontend and 5 ms steps: nothing queues, the prompt takes one
    step, each later token one more."""
    prof = fast_profile(step_base_ms=5.0, frontend_request_ms=7.0)
    turns = load_turns(_dataset(tmp_path, 4, 20), prof)
    res = simulate(turns, prof, 0.0, concurrency=1, request_count=4, warmup_count=1,
                   policy=OutputPolicy(4, 4, True))
    block = res.engine.stages()
    assert block["available"] and block["requests"] == 5  # the warmup request too
    assert block["avg_ms"] == {"frontend": 7.0, "queue": 0.0, "prefill": 5.0, "decode": 15.0,
                               "ttft": 12.0}


def test_a_request_ready_mid_step_waits_for_the_step_before_the_frontend_stage_ends(tmp_path):
    """As vLLM's engine reads new requests only between steps (and stamps them queued then):
    two requests at once, a serial 7 ms frontend, 5 ms steps. The first is ready at 7 and
    prefills 7-12; the second is ready at 14, inside the step 12-17, so its time before the
    scheduler runs to 17 (17 ms, not 14), and it is scheduled at once (queue 0, not 3)."""
    prof = fast_profile(step_base_ms=5.0, frontend_request_ms=7.0)
    turns = load_turns(_dataset(tmp_path, 2, 20), prof)
    res = simulate(turns, prof, 0.0, concurrency=2, request_count=2, warmup_count=0,
                   policy=OutputPolicy(4, 4, True))
    assert [r.first_token_ns // 1_000_000 for r in res.records] == [12, 22]
    assert res.engine.stages()["avg_ms"] == {"frontend": 12.0, "queue": 0.0, "prefill": 5.0,
                                             "decode": 15.0, "ttft": 17.0}


@settings(max_examples=25, deadline=None)
@given(concurrency=st.integers(1, 6), frontend=st.sampled_from([0.0, 3.0, 11.0]),
       step=st.sampled_from([1.0, 4.0]), per_token=st.sampled_from([0.0, 0.002]),
       budget=st.sampled_from([64, 8192]), outputs=st.integers(1, 6))
def test_the_stages_add_up_to_each_request(tmp_path_factory, concurrency, frontend, step,
                                           per_token, budget, outputs):
    """Over any run, the stages' means add up to the requests' own: frontend + queue +
    prefill is the mean time to first token, all four the mean latency; none is negative.
    (Chunked prompts, a token budget of 64, and queues behind a busy frontend included.)"""
    tmp = tmp_path_factory.mktemp("stages")
    prof = fast_profile(step_base_ms=step, frontend_request_ms=frontend,
                        per_prefill_token_ms=per_token, token_budget=budget, max_running=4)
    turns = load_turns(_dataset(tmp, 9, 40), prof)
    res = simulate(turns, prof, 0.0, concurrency=concurrency, request_count=12,
                   warmup_count=2, policy=OutputPolicy(outputs, outputs, True))
    avg = res.engine.stages()["avg_ms"]
    recs = res.records
    ttft = sum(r.first_token_ns - r.start_ns for r in recs) / len(recs) / 1e6
    latency = sum(r.end_ns - r.start_ns for r in recs) / len(recs) / 1e6
    assert all(avg[k] >= -1e-9 for k in STAGES), avg
    assert avg["ttft"] == pytest.approx(ttft, abs=2e-3)  # each mean rounded to 1 us
    assert sum(avg[k] for k in STAGES) == pytest.approx(latency, abs=4e-3)


VLLM = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {n}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {n}
vllm:request_queue_time_seconds_sum{{engine="0",model_name="m"}} {queue}
vllm:request_queue_time_seconds_count{{engine="0",model_name="m"}} {n}
vllm:request_prefill_time_seconds_sum{{engine="0",model_name="m"}} {prefill}
vllm:request_decode_time_seconds_sum{{engine="0",model_name="m"}} {decode}
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""


def test_vllms_histograms_give_the_stages_of_the_run():
    before = parse_metrics(VLLM.format(ttft=1.0, n=10, queue=0.2, prefill=0.3, decode=2.0))
    after = parse_metrics(VLLM.format(ttft=3.0, n=30, queue=0.6, prefill=1.1, decode=6.0))
    block = stage_delta(before, after)
    # 20 requests: 100 ms to first token each, of which 20 queued and 40 prefilling
    assert block["requests"] == 20
    assert block["avg_ms"] == pytest.approx({"frontend": 40.0, "queue": 20.0, "prefill": 40.0,
                                             "decode": 200.0, "ttft": 100.0})
    assert not stage_delta(before, before)["available"]  # no request finished in between
    plain = parse_metrics("vllm:num_requests_running 1\n")
    assert "the server's /metrics has no request stage" in stage_delta(plain, plain)["reason"]


def test_bench_records_the_servers_stages(tmp_path):
    """bench against the embedded simulator: the export's stages are the server's, counted on
    its own clock: every request (warmup too), and none later to its first token than the
    client saw it (the client's time also holds the request's sending and parsing)."""
    from mmdatagen.loadgen.run import run_bench
    from mmdatagen.loadgen.setup import bench_run
    from mmdatagen.settings.base import build
    from mmdatagen.settings.load import BenchTarget, Load

    data = _dataset(tmp_path, 12, 30)
    profile = tmp_path / "p.yaml"
    profile.write_text("step_base_ms: 2.0\nper_seq_ms: 0.0\nfrontend_request_ms: 3.0\n"
                       "natural_output_tokens: 4\n")
    load = build(Load, {"input_file": data, "profile": str(profile), "concurrency": 3,
                        "warmup_request_count": 2, "quiet": True})
    run_bench(bench_run(load, BenchTarget(output_dir=tmp_path / "out")))
    export = json.loads((tmp_path / "out" / "profile_export_mmdatagen.json").read_text())
    stages = export["server_stages"]
    sent = export["request_count"]["avg"] + export["warmup_metrics"]["request_count"]["avg"]
    assert stages["available"] and stages["requests"] == sent == 12, (stages, sent)
    avg = stages["avg_ms"]
    # the real-time driver starts a step when its clock says so: a few tenths of a ms either way
    assert avg["frontend"] >= 3.0 and avg["prefill"] > 1.0 and avg["decode"] >= 3 * 2.0 - 0.5
    assert avg["ttft"] <= export["time_to_first_token"]["avg"]
    from mmdatagen.console import console_table

    assert "Server stages, mean per request: frontend" in console_table(export)
