"""Metric definitions (aiperf-compat.md) on hand-made records."""
from __future__ import annotations

import numpy as np
import orjson
import pytest

from mmdatagen.metrics import (
    EXPORT_NAME,
    RECORDS_NAME,
    RequestRecord,
    build_export,
    console_table,
    stats_block,
    write_exports,
)

MS = 1_000_000


def rec(start_ms, ttft_ms, lat_ms, tokens, *, phase="profiling", error=None, hits=None,
        misses=None, server_ttft_ms=None, images=1, resp_end_ms=None, streaming=True, i=0):
    return RequestRecord(
        conversation_id=f"c{i}", turn_index=0, phase=phase, start_ns=int(start_ms * MS),
        first_token_ns=None if ttft_ms is None else int((start_ms + ttft_ms) * MS),
        end_ns=None if lat_ms is None else int((start_ms + lat_ms) * MS),
        output_tokens=tokens, input_tokens=100, num_images=images, error=error,
        image_hits=hits, image_misses=misses,
        server_ttft_ns=None if server_ttft_ms is None else int(server_ttft_ms * MS),
        x_request_id=f"r{i}", streaming=streaming,
        response_end_ns=None if resp_end_ms is None else int(resp_end_ms * MS))


def test_per_request_definitions():
    r = rec(1000, 50, 150, 11, server_ttft_ms=49)
    v = r.values()
    assert v["time_to_first_token"] == pytest.approx(50)
    assert v["request_latency"] == pytest.approx(150)
    assert v["inter_token_latency"] == pytest.approx(10)  # (150 - 50) / (11 - 1)
    assert v["output_token_throughput_per_user"] == pytest.approx(100)  # 1 / 10 ms
    assert v["client_added_ttft"] == pytest.approx(1)
    assert v["output_sequence_length"] == 11


def test_itl_needs_two_tokens_and_streaming():
    assert "inter_token_latency" not in rec(0, 5, 5, 1).values()
    v = rec(0, 5, 50, 10, streaming=False).values()
    assert "time_to_first_token" not in v and "inter_token_latency" not in v
    assert v["request_latency"] == pytest.approx(50)


def test_stats_block_matches_numpy_linear():
    vals = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    b = stats_block(vals, "ms")
    assert b["p50"] == pytest.approx(np.percentile(vals, 50))
    assert b["p99"] == pytest.approx(np.percentile(vals, 99))
    assert b["p1"] == pytest.approx(np.percentile(vals, 1))
    assert b["std"] == pytest.approx(np.std(vals))
    assert b["count"] == 8 and b["sum"] == pytest.approx(31) and b["min"] == 1 and b["max"] == 9
    assert list(b) == ["unit", "avg", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95",
                       "p99", "min", "max", "std", "count", "sum"]


def test_run_level_window_excludes_warmup_and_counts_errors():
    records = [
        rec(0, 10, 100, 5, phase="warmup", i=0),
        rec(1000, 10, 100, 5, i=1),                        # 1000 .. 1100
        rec(1050, 10, 300, 7, i=2, resp_end_ms=1360),      # last response 1360
        rec(1200, None, None, 0, error={"type": "HTTPError", "code": 500, "message": "x"}, i=3),
    ]
    ex = build_export(records, input_config={"a": 1})
    assert ex["benchmark_duration"]["avg"] == pytest.approx(0.36)
    assert ex["request_count"]["avg"] == 2
    assert ex["error_request_count"]["avg"] == 1
    assert ex["request_throughput"]["avg"] == pytest.approx(2 / 0.36)
    assert ex["output_token_throughput"]["avg"] == pytest.approx(12 / 0.36)
    assert ex["time_to_first_token"]["count"] == 2
    assert ex["warmup_metrics"]["request_count"]["avg"] == 1
    assert ex["error_summary"] == [{"error_details": {"type": "HTTPError", "code": 500,
                                                      "message": "x"}, "count": 1}]
    for key in ("schema_version", "aiperf_version", "benchmark_id", "start_time", "end_time",
                "was_cancelled", "is_complete", "error_summary", "input_config", "run_info",
                "warmup_metrics"):
        assert key in ex
    assert ex["was_cancelled"] is False and ex["is_complete"] is True


def test_cache_split_and_measured_hits():
    records = [rec(0, 10, 20, 2, hits=1, misses=0, i=0),
               rec(0, 30, 40, 2, hits=0, misses=1, i=1),
               rec(0, 12, 40, 2, hits=2, misses=0, images=2, i=2)]
    c = build_export(records, input_config={})["image_cache"]
    assert c["measured"]["hits"] == 3 and c["measured"]["misses"] == 1
    assert c["measured"]["hit_rate"] == pytest.approx(0.75)
    assert c["time_to_first_token_all_hit"]["avg"] == pytest.approx(11)
    assert c["time_to_first_token_not_all_hit"]["avg"] == pytest.approx(30)


def test_write_exports_and_table(tmp_path):
    records = [rec(0, 10, 100, 5, i=0, hits=1, misses=0),
               rec(10, None, None, 0, i=1, error={"type": "Timeout", "code": None,
                                                  "message": "t"})]
    ex = build_export(records, input_config={}, was_cancelled=True, wall_offset_ns=10**18)
    paths = write_exports(tmp_path, records, ex)
    assert paths["export"].name == EXPORT_NAME
    loaded = orjson.loads(paths["export"].read_bytes())
    assert loaded["was_cancelled"] is True and loaded["is_complete"] is False
    assert loaded["start_time"].startswith("2001-09-09")
    lines = (tmp_path / RECORDS_NAME).read_bytes().splitlines()
    assert len(lines) == 2
    first = orjson.loads(lines[0])
    assert first["metadata"]["benchmark_phase"] == "profiling"
    assert first["metrics"]["request_latency"]["value"] == pytest.approx(100)
    assert orjson.loads(lines[1])["error"]["type"] == "Timeout"
    table = console_table(ex)
    assert "Time to First Token (ms)" in table and "Timeout" in table and "cancelled" in table


def test_simulated_time_rescale_and_wall_span():
    from mmdatagen.loadgen.run import to_simulated_time

    records = [rec(1000, 10, 100, 11, server_ttft_ms=8, i=0), rec(1100, 20, 50, 2, i=1)]
    to_simulated_time(records, 0.25)  # wall = simulated * 0.25
    v = records[0].values()
    assert v["time_to_first_token"] == pytest.approx(40)
    assert v["request_latency"] == pytest.approx(400)
    assert v["client_added_ttft"] == pytest.approx(40 - 32)
    assert records[1].start_ns == pytest.approx(1000 * MS + 400 * MS)
    ex = build_export(records, input_config={}, wall_span_ns=(0, 10**9))
    assert ex["start_time"].startswith("1970-01-01T00:00:00")
    assert ex["end_time"].startswith("1970-01-01T00:00:01")


def test_server_cache_counters_vllm_dynamo_and_simulator():
    from mmdatagen.loadgen.run import counter_delta, parse_cache_counters

    vllm = ('# HELP vllm:mm_cache_queries Number of queries\n'
            'vllm:mm_cache_queries_total{engine="0",model_name="m"} 10.0\n'
            'vllm:mm_cache_queries_created{engine="0",model_name="m"} 1.7e9\n'
            'vllm:mm_cache_hits_total{engine="0",model_name="m"} 4.0\n')
    vllm2 = vllm.replace("10.0", "30.0").replace("4.0", "20.0")
    d = counter_delta(parse_cache_counters(vllm), parse_cache_counters(vllm2))
    assert d["source"].startswith("vllm") and (d["hits"], d["queries"]) == (16, 20)
    assert d["hit_rate"] == pytest.approx(0.8)
    dyn = ("dynamo_component_embedding_cache_hits_total{w=\"a\"} 3\n"
           "dynamo_component_embedding_cache_hits_total{w=\"b\"} 2\n"
           "dynamo_component_embedding_cache_misses_total 5\n")
    assert counter_delta(None, parse_cache_counters(dyn)) is None  # scrape failed before
    # labelled counters absent before the first request count from zero
    d = counter_delta(parse_cache_counters(""), parse_cache_counters(dyn))
    assert d["source"].startswith("dynamo") and (d["hits"], d["queries"]) == (5, 10)
    sim = ("mmdatagen_sim_embedding_cache_hits_total 7\n"
           "mmdatagen_sim_embedding_cache_misses_total 3\n")
    d = counter_delta({"sim_hits": 1.0, "sim_misses": 1.0}, parse_cache_counters(sim))
    assert d["source"] == "simulator /metrics" and (d["hits"], d["queries"]) == (6, 8)
