"""Causal session replay, multi_turn history, phases, rate pacing and exports against a stub."""
from __future__ import annotations

import orjson
import pytest
from loadgen_helpers import Stub, bench_config, write_jsonl

from mmdatagen.errors import UserError
from mmdatagen.io.readers import iter_turns
from mmdatagen.loadgen.run import run_bench
from mmdatagen.loadgen.sessions import SessionSource


@pytest.fixture(scope="module")
def stub():
    with Stub() as s:
        yield s


def _session_rows():
    # interleaved sessions A and B, plus session-less rows
    return [{"text": "a0", "session_id": "A"}, {"text": "b0", "session_id": "B"},
            {"text": "x"}, {"text": "a1", "session_id": "A", "delay": 5},
            {"text": "b1", "session_id": "B"}, {"text": "a2", "session_id": "A"}]


def test_session_source_first_appearance_order_and_file_order(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", _session_rows())
    src = SessionSource(lambda: iter_turns(path, "single_turn"), "single_turn")
    sessions = []
    while (s := src.next_session()) is not None:
        texts = []
        while (t := src.next_turn(s)) is not None:
            texts.append(t.texts[0])
        sessions.append((s.conversation_id, texts))
    assert sessions == [("A", ["a0", "a1", "a2"]), ("B", ["b0", "b1"]), ("row_3", ["x"])]


def test_causal_replay_over_http(stub, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", _session_rows())
    stub.log.clear()
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", concurrency=2, streaming=True))
    assert len(res.records) == 6 and res.export["error_request_count"]["avg"] == 0
    log = list(stub.log)
    by_text = {e["body"]["messages"][0]["content"]: e for e in log}
    for _sid, texts in (("A", ["a0", "a1", "a2"]), ("B", ["b0", "b1"])):
        corr = {by_text[t]["headers"]["X-Correlation-ID"] for t in texts}
        assert len(corr) == 1  # stable across a session's turns
        for prev, nxt in zip(texts, texts[1:]):
            assert by_text[nxt]["arrive"] >= by_text[prev]["finish"]  # next only after previous
    # no history in single_turn: each request carries only its own row
    assert all(len(e["body"]["messages"]) == 1 for e in log)
    assert len({e["headers"]["X-Request-ID"] for e in log}) == 6
    # concurrency counts sessions: with 2 workers, 'x' starts only after A or B finished
    assert by_text["x"]["arrive"] >= min(by_text["a2"]["finish"], by_text["b1"]["finish"])


def test_multi_turn_history_with_live_replies(stub, tmp_path):
    rows = [{"session_id": "s1", "turns": [{"text": "q1", "image": "data:image/png;base64,AAAA"},
                                           {"text": "q2"}, {"text": "q3"}]}]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    stub.log.clear()
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", model="echo", streaming=True))
    assert len(res.records) == 3 and not any(r.error for r in res.records)
    msgs = [e["body"]["messages"] for e in stub.log]
    assert [len(m) for m in msgs] == [1, 3, 5]
    assert msgs[2][1] == {"role": "assistant", "content": "reply-1"}
    assert msgs[2][3] == {"role": "assistant", "content": "reply-3"}
    assert msgs[2][0]["content"][1]["image_url"]["url"].startswith("data:")  # images resent
    assert msgs[2][4]["content"] == "q3"
    assert [r.turn_index for r in sorted(res.records, key=lambda r: r.start_ns)] == [0, 1, 2]


def test_warmup_then_profiling_counts_and_wrap(stub, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"r{i}"} for i in range(5)])
    stub.log.clear()
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", concurrency=4,
                                 warmup_request_count=3, request_count=9))
    warm = [r for r in res.records if r.phase == "warmup"]
    prof = [r for r in res.records if r.phase == "profiling"]
    assert len(warm) == 3 and len(prof) == 9
    assert max(r.response_end_ns for r in warm) <= min(r.start_ns for r in prof)
    assert res.export["request_count"]["avg"] == 9
    assert res.export["warmup_metrics"]["request_count"]["avg"] == 3
    # profiling continues where warmup stopped, wrapping the 5-row file
    texts = [e["body"]["messages"][0]["content"] for e in stub.log]
    assert texts[:3] == ["r0", "r1", "r2"] and sorted(texts[3:5]) == ["r3", "r4"]
    assert len(texts) == 12


def test_constant_rate_paces_requests(stub, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "r"}] * 6)
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", request_rate=50.0,
                                 arrival="constant", concurrency=8))
    starts = sorted(r.start_ns for r in res.records)
    assert len(starts) == 6
    assert (starts[-1] - starts[0]) / 1e9 >= 5 / 50 * 0.95  # 5 intervals of 20 ms at least


def test_exports_written_and_api_key_never_exported(stub, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "r"}] * 3)
    stub.log.clear()
    secret = "sk-very-SECRET-0123456789"
    out = tmp_path / "out"
    res = run_bench(bench_config(path, stub.url, out, api_key=secret,
                                 headers={"X-Api-Key": "hdr-SECRET-xyz", "X-Plain": "v"}))
    assert stub.log[0]["headers"]["Authorization"] == f"Bearer {secret}"
    assert stub.log[0]["headers"]["X-Api-Key"] == "hdr-SECRET-xyz"
    for f in out.iterdir():
        text = f.read_text()
        assert secret not in text and "hdr-SECRET-xyz" not in text
    doc = orjson.loads((out / "profile_export_mmdatagen.json").read_bytes())
    assert doc["input_config"]["api_key_set"] is True
    assert doc["input_config"]["headers"]["X-Plain"] == "v"
    assert len((out / "records.jsonl").read_bytes().splitlines()) == 3
    assert res.records[0].image_hits == 1 and res.records[0].server_ttft_ns == 1000


def test_predicted_hits_from_dispatch_order(stub, tmp_path):
    import base64
    import io

    from PIL import Image

    urls = []
    for color in ("red", "blue"):
        buf = io.BytesIO()
        Image.new("RGB", (64, 64), color).save(buf, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    rows = [{"text": "q", "image": urls[i % 2]} for i in range(6)] + [{"text": "no image"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    # vLLM's encoder cache in front of Dynamo's holds one of the two alternating images: every
    # reference reaches Dynamo's tier
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", predict=True,
                                 model="qwen3-vl-30b-a3b", cache_gb=1.0, encoder_budget=64))
    pred = res.export["image_cache"]["predicted"]
    assert pred["references"] == 6 and pred["hits"] == 4 and pred["misses"] == 2
    wide = run_bench(bench_config(path, stub.url, tmp_path / "out4", predict=True,
                                  model="qwen3-vl-30b-a3b", cache_gb=1.0, encoder_budget=128))
    pred = wide.export["image_cache"]["predicted"]  # now both stay in the front: 4 never ask
    assert pred["references"] == 2 and pred["hits"] == 0
    assert sum(r.predicted_hits or 0 for r in res.records) == 4
    tiny = run_bench(bench_config(path, stub.url, tmp_path / "out2", predict=True,
                                  model="qwen3-vl-30b-a3b", cache_gb=1e-9))
    assert tiny.export["image_cache"]["predicted"]["hits"] == 0
    unknown = run_bench(bench_config(path, stub.url, tmp_path / "out3", predict=True))
    assert "not in the registry" in unknown.export["image_cache"]["predicted"]["note"]


def test_rows_are_read_lazily(stub, tmp_path):
    path = write_jsonl(tmp_path / "big.jsonl", [{"text": f"r{i}"} for i in range(20000)])
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", concurrency=4,
                                 request_count=10, warmup_request_count=2))
    assert len(res.records) == 12
    assert res.export["run_info"]["dataset_rows_read"] <= 12 + 4  # never the whole file


def test_benchmark_duration_stops_issuing(stub, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "r"}] * 3)
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", concurrency=2,
                                 benchmark_duration=0.3, model="slow"))
    n = len(res.records)
    assert 2 <= n <= 2 * (0.3 / 0.2 + 2)  # 0.2 s per request, 2 in flight
    assert res.export["run_info"]["dataset_passes"] >= 1 and not res.export["was_cancelled"]
    assert all(r.error is None for r in res.records)


def test_local_files_encoded_once_over_http(stub, tmp_path):
    from PIL import Image

    for name, colour in (("a.png", "red"), ("b.jpg", "blue")):
        Image.new("RGB", (40, 30), colour).save(tmp_path / name)
    rows = [{"text": "q", "image": str(tmp_path / ("a.png" if i % 3 else "b.jpg"))}
            for i in range(12)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    stub.log.clear()
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", concurrency=6))
    assert res.export["run_info"]["files_encoded"] == 2
    urls = {e["body"]["messages"][0]["content"][1]["image_url"]["url"][:22] for e in stub.log}
    assert urls == {"data:image/png;base64,", "data:image/jpeg;base64"}


def test_random_pool_samples_with_replacement(stub, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"text": f"p{i}"} for i in range(4)])
    stub.log.clear()
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", dataset_type="random_pool",
                                 request_count=40, concurrency=4, seed=7))
    texts = [e["body"]["messages"][0]["content"] for e in stub.log]
    assert len(res.records) == 40 and set(texts) == {"p0", "p1", "p2", "p3"}
    assert len(set(r.conversation_id for r in res.records)) == 40
    stub.log.clear()
    default = run_bench(bench_config(path, stub.url, tmp_path / "o2",
                                     dataset_type="random_pool"))
    assert len(default.records) == 4  # one draw per pool entry by default


def test_completions_endpoint_over_http(stub, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"texts": ["a", "b"]}])
    stub.log.clear()
    res = run_bench(bench_config(path, stub.url + "/v1", tmp_path / "out",
                                 endpoint_type="completions", streaming=True))
    assert res.records[0].error is None and res.records[0].output_tokens == 3
    assert stub.log[0]["body"]["prompt"] == "a b"
    assert res.export["run_info"]["endpoint"] == "/v1/completions"  # no doubled /v1


def test_fixed_schedule_sends_at_timestamps(stub, tmp_path):
    rows = [{"text": "t0", "timestamp": 1000}, {"text": "t1", "timestamp": 1150},
            {"text": "t2", "timestamp": 1300, "session_id": "s"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    res = run_bench(bench_config(path, stub.url, tmp_path / "out", fixed_schedule=True))
    starts = sorted(r.start_ns for r in res.records)
    assert len(starts) == 3 and not any(r.error for r in res.records)
    assert (starts[1] - starts[0]) / 1e6 >= 150 * 0.95 and (starts[2] - starts[0]) / 1e6 >= 285
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "x", "timestamp": 0}, {"text": "y"}])
    with pytest.raises(UserError, match="timestamp"):
        run_bench(bench_config(bad, stub.url, tmp_path / "o2", fixed_schedule=True))
