"""Goodput, repeat statistics, /metrics time series, report aggregates, sweep and the HTML report."""
from __future__ import annotations

import base64
import csv
import io
import math

import orjson
import pytest
from browser_helpers import inspect_page
from hypothesis import given, settings
from hypothesis import strategies as st
from loadgen_helpers import write_jsonl

from mmdatagen.errors import UserError
from mmdatagen.loadgen import goodput as gp
from mmdatagen.loadgen import scrape, stats
from mmdatagen.metrics import RequestRecord
from mmdatagen.report import aggregate, figures


def rec(i, start_ms, ttft_ms, end_ms, tokens=5, ok=True, phase="profiling", hits=None,
        misses=None, pred=None):
    ns = 1_000_000
    return RequestRecord(
        conversation_id=f"c{i}", turn_index=0, phase=phase, start_ns=start_ms * ns,
        first_token_ns=None if ttft_ms is None else (start_ms + ttft_ms) * ns,
        end_ns=end_ms * ns if ok else None, output_tokens=tokens, input_tokens=10, num_images=1,
        error=None if ok else {"type": "x", "code": 500, "message": "boom"}, image_hits=hits,
        image_misses=misses, server_ttft_ns=None, x_request_id=str(i), streaming=True,
        response_end_ns=end_ms * ns if ok else start_ms * ns, predicted_hits=pred)


# -- goodput ----------------------------------------------------------------------------------
def test_parse_slos_names_and_errors():
    assert gp.parse_slos(["ttft:300 itl:20", "e2el:5000"]) == {
        "time_to_first_token": 300.0, "inter_token_latency": 20.0, "request_latency": 5000.0}
    assert gp.parse_slos("tpot:15") == {"inter_token_latency": 15.0}  # vLLM's name for ITL
    for bad in ("ttft", "foo:3", "ttft:x", "ttft:0"):
        with pytest.raises(UserError):
            gp.parse_slos([bad])


def test_good_requests_meet_every_objective_inclusive():
    # latency 105 ms, TTFT 10 ms, 5 tokens -> ITL (105 - 10) / 4 = 23.75 ms
    recs = [rec(0, 0, 10, 105), rec(1, 0, 50, 105), rec(2, 0, 10, 105, ok=False),
            rec(3, 0, None, 105), rec(4, 0, 10, 105, phase="warmup")]
    export = {"benchmark_duration": {"avg": 2.0}}
    out = gp.export_goodput(recs, export, {"time_to_first_token": 10.0,
                                           "inter_token_latency": 23.75})
    # only record 0: record 1 misses TTFT, 2 failed, 3 has no TTFT, 4 is warmup
    assert out["good_request_count"]["avg"] == 1
    assert out["goodput"]["avg"] == pytest.approx(0.5)
    assert gp.is_good({"output_token_throughput_per_user": 50.0},
                      {"output_token_throughput_per_user": 40.0})  # larger is better
    assert not gp.is_good({"output_token_throughput_per_user": 30.0},
                          {"output_token_throughput_per_user": 40.0})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.floats(0, 100)), max_size=40),
       st.floats(1, 1000), st.floats(1, 100), st.floats(0, 500))
def test_goodput_is_monotone_in_objectives(vals, ttft_slo, itl_slo, extra):
    rows = [{"time_to_first_token": a, "inter_token_latency": b} for a, b in vals]
    tight = gp.good_count(rows, {"time_to_first_token": ttft_slo, "inter_token_latency": itl_slo})
    loose = gp.good_count(rows, {"time_to_first_token": ttft_slo + extra,
                                 "inter_token_latency": itl_slo + extra})
    only_ttft = gp.good_count(rows, {"time_to_first_token": ttft_slo})
    assert tight <= loose <= len(rows) and tight <= only_ttft


# -- statistics -------------------------------------------------------------------------------
@pytest.mark.parametrize("df,t", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622),
                                  (29, 2.0452), (10_000, 1.9602)])
def test_t_quantile_matches_tables(df, t):
    assert stats.t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)


def test_summarize_mean_ci_and_spread():
    s = stats.summarize([10.0, 12.0, 14.0, None])
    assert s["n"] == 3 and s["mean"] == 12.0 and s["std"] == pytest.approx(2.0)
    assert s["ci95_half"] == pytest.approx(4.3027 * 2.0 / math.sqrt(3), rel=1e-4)
    assert (s["min"], s["max"]) == (10.0, 14.0)
    one = stats.summarize([5.0])
    assert one["mean"] == 5.0 and one["ci95_half"] is None and one["std"] is None


# -- /metrics ---------------------------------------------------------------------------------
VLLM = """# HELP vllm:num_requests_running x
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 2.0
vllm:num_requests_waiting{model_name="m"} 7.0
vllm:mm_cache_queries_total{model_name="m"} 40.0
vllm:mm_cache_hits_total{model_name="m"} 30.0
"""


def test_parse_metrics_and_series():
    v = scrape.parse_metrics(VLLM)
    assert v == {"running": 5.0, "waiting": 7.0, "vllm_queries": 40.0, "vllm_hits": 30.0}
    assert scrape.parse_cache_counters(VLLM) == {"vllm_queries": 40.0, "vllm_hits": 30.0}
    samples = [(1_000_000_000, {"running": 1.0, "vllm_hits": 0.0, "vllm_queries": 0.0}),
               (2_000_000_000, {"running": 4.0, "waiting": 2.0}),  # counters missing here
               (3_000_000_000, {"running": 2.0, "vllm_hits": 5.0, "vllm_queries": 10.0}),
               (4_000_000_000, {"running": 0.0, "vllm_hits": 14.0, "vllm_queries": 20.0})]
    s = scrape.build_series(samples, base_ns=1_000_000_000, scale=2.0, interval_s=1.0)
    assert s["t_s"] == [0.0, 0.5, 1.0, 1.5]  # simulated seconds with time scale 2
    assert s["running"] == [1.0, 4.0, 2.0, 0.0] and s["waiting"] == [None, 2.0, None, None]
    assert s["hit_rate"] == [None, None, None, pytest.approx(0.9)]
    assert s["cache_source"] == "vllm:mm_cache_*"


# -- aggregates -------------------------------------------------------------------------------
def test_timeline_in_flight_and_tokens():
    # two requests: [0, 1000] ms and [500, 1500] ms; 10 tokens each between TTFT and end
    recs = [rec(0, 0, 100, 1000, tokens=10, hits=1, misses=0, pred=1),
            rec(1, 500, 100, 1500, tokens=10, hits=0, misses=1, pred=0)]
    agg = aggregate.run_aggregates(recs)
    tl = agg["timeline"]
    assert tl["bin_s"] == pytest.approx(0.02)
    t = tl["t_s"]
    at = {round(x, 3): v for x, v in zip(t, tl["in_flight"])}
    assert at[0.2] == 1 and at[0.6] == 2 and at[1.2] == 1
    total = sum(tl["output_tokens_per_s"]) * tl["bin_s"]
    assert total == pytest.approx(20.0, rel=1e-4)
    assert sum(tl["hits"]) == 1 and sum(tl["misses"]) == 1 and sum(tl["predicted_hits"]) == 1
    q = agg["distributions"]["time_to_first_token"]
    assert len(q) == 201 and q[0] == pytest.approx(100.0) and q[-1] == pytest.approx(100.0)


def test_pareto_front():
    pts = [(100, 50), (200, 60), (150, 80), (300, 200), (250, 250)]
    assert figures.pareto_front(pts) == [(100, 50), (200, 60), (300, 200)]


# -- sweep on the simulator ---------------------------------------------------------------------
def _dataset(tmp_path, n=24, distinct=4):
    from PIL import Image

    urls = []
    for i in range(distinct):
        buf = io.BytesIO()
        Image.new("RGB", (32, 32), (40 * i, 10, 200)).save(buf, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    return write_jsonl(tmp_path / "d.jsonl",
                       [{"text": f"question {i}", "image": urls[i % distinct]} for i in range(n)])


def test_virtual_sweep_writes_json_csv_report_and_resumes(tmp_path, run_cli):
    data = _dataset(tmp_path)
    out = tmp_path / "sw"
    args = ("sweep", "--input-file", data, "--virtual", "--concurrency", "1,4",
            "--cache-gb", "0,1", "--repeats", "2", "--extra-inputs", "max_tokens:8",
            "--goodput", "ttft:1000", "e2el:100000", "--output-dir", out,
            # vLLM's encoder cache in front of Dynamo's holds one image: repeats reach Dynamo
            "--sim-param", "encoder_budget=64")
    res = run_cli(*args)
    assert res.exit_code == 0, res.output
    doc = orjson.loads((out / "sweep.json").read_bytes())
    assert [p["name"] for p in doc["points"]] == [
        "concurrency-1_cache_gb-0_encoder_budget-64", "concurrency-1_cache_gb-1_encoder_budget-64", "concurrency-4_cache_gb-0_encoder_budget-64",
        "concurrency-4_cache_gb-1_encoder_budget-64"]
    assert doc["goodput_slos"] == {"time_to_first_token": 1000.0, "request_latency": 100000.0}
    by = {p["name"]: p for p in doc["points"]}
    # 24 requests over 4 distinct images: cache off never hits, 1 GiB hits all but 4
    assert by["concurrency-1_cache_gb-0_encoder_budget-64"]["summary"]["hit_rate"]["mean"] == 0.0
    assert by["concurrency-1_cache_gb-1_encoder_budget-64"]["summary"]["hit_rate"]["mean"] == pytest.approx(20 / 24)
    assert by["concurrency-1_cache_gb-1_encoder_budget-64"]["summary"]["predicted_hit_rate"]["mean"] == \
        pytest.approx(20 / 24)
    s = by["concurrency-4_cache_gb-1_encoder_budget-64"]["summary"]["output_token_throughput"]
    assert s["n"] == 2 and s["ci95_half"] is not None
    rows = list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))
    assert len(rows) == 8 and {r["repeat"] for r in rows} == {"1", "2"}
    assert all(r["resumed"] == "False" and r["good_request_count"] == "24" for r in rows)
    for p in doc["points"]:
        for run in p["runs"]:
            ex = orjson.loads((tmp_path / run["dir"] / "profile_export_mmdatagen.json")
                              .read_bytes())
            assert ex["good_request_count"]["avg"] == 24 and ex["timeline"]["t_s"]
            assert ex["server_stages"]["requests"] == 24  # the virtual engine's own stages
    html = (out / "report.html").read_text()
    assert "Sweep table" in html and "Pareto" in html and "Hit rate against cache size" in html
    assert "<script src" not in html and "http://" not in html and "https://" not in html
    assert "Concurrency" not in res.output and "Output TPS" in res.output
    page = inspect_page(out / "report.html", """JSON.stringify(Array.from(
        document.querySelectorAll('td[data-metric="output_token_throughput"]')).map(
        td => parseFloat(td.dataset.value)))""")
    assert page["errors"] == []
    assert orjson.loads(page["value"]) == pytest.approx(
        [p["summary"]["output_token_throughput"]["mean"] for p in doc["points"]])
    # resumable: every run's export exists, nothing runs again
    res2 = run_cli(*args)
    assert res2.exit_code == 0
    rows2 = list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))
    assert all(r["resumed"] == "True" for r in rows2)
    assert [r["output_token_throughput"] for r in rows2] == \
        [r["output_token_throughput"] for r in rows]


def test_embedded_sweep_fresh_server_per_run(tmp_path, run_cli):
    """Over HTTP on the embedded simulator: each run starts cold, /metrics is sampled."""
    data = _dataset(tmp_path, n=8, distinct=2)
    out = tmp_path / "sw"
    # concurrency 1: with two requests in flight, an image in use cannot leave the encoder
    # cache, so how many repeats reach Dynamo's tier would depend on timing
    res = run_cli("sweep", "--input-file", data, "--profile", "zero-delay", "--concurrency",
                  "1", "--repeats", "2", "--sim-param", "max_running=1,4", "--extra-inputs",
                  "max_tokens:4", "--metrics-interval", "0.05", "--output-dir", out, "-q",
                  "--sim-arg=--encoder-budget=64")  # the encoder cache in front: one image
    assert res.exit_code == 0, res.output
    doc = orjson.loads((out / "sweep.json").read_bytes())
    assert doc["target"].startswith("embedded simulator (fresh server per run")
    assert [p["params"] for p in doc["points"]] == [{"concurrency": 1, "max_running": 1},
                                                    {"concurrency": 1, "max_running": 4}]
    for p in doc["points"]:
        for run in p["runs"]:
            # a fresh server: the 2 distinct images miss once each in every run
            assert run["hit_rate"] == pytest.approx(6 / 8)
            ex = orjson.loads((tmp_path / run["dir"] / "profile_export_mmdatagen.json")
                              .read_bytes())
            assert ex["server_metrics_timeseries"]["available"] is True
            assert ex["server_metrics_timeseries"]["cache_source"] == "simulator /metrics"
    assert (out / "profiles" / "concurrency-1_max_running-1.yaml").is_file()


def test_url_sweep_on_a_server_without_metrics_says_so_once(tmp_path):
    """--url: the server as it is; no /metrics is fine, said once for the whole sweep."""
    import subprocess
    import sys

    from loadgen_helpers import Stub

    data = write_jsonl(tmp_path / "d.jsonl", [{"text": f"q{i}"} for i in range(6)])
    with Stub() as stub:
        proc = subprocess.run(
            [sys.executable, "-m", "mmdatagen", "sweep", "--input-file", str(data), "--url",
             stub.url, "--model", "ok", "--concurrency", "1,2", "--repeats", "2",
             "--extra-inputs", "max_tokens:3", "--goodput", "e2el:60000", "--output-dir",
             str(tmp_path / "sw")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("server metrics not collected") == 1
    doc = orjson.loads((tmp_path / "sw" / "sweep.json").read_bytes())
    assert doc["target"].startswith(stub.url) and "not reset" in doc["target"]
    runs = [r for p in doc["points"] for r in p["runs"]]
    assert len(runs) == 4 and all(r["request_count"] == 6 and r["good_request_count"] == 6
                                  for r in runs)
    assert "± " in proc.stdout  # means with confidence intervals


@pytest.mark.parametrize("args,message", [
    (["--concurrency", "1,x"], "has a bad value 'x'"),
    (["--concurrency", "0"], "--concurrency must be >= 1"),
    (["--sim-param", "nope=1"], "profile field"),
    (["--repeats", "0"], "--repeats"),
    (["--url", "http://127.0.0.1:9", "--model", "m", "--cache-gb", "1,2"], "simulator"),
])
def test_sweep_user_errors(tmp_path, args, message):
    from conftest import run_subprocess

    data = _dataset(tmp_path, n=2)
    proc = run_subprocess("sweep", "--input-file", data, *args, "-q", "--output-dir",
                          tmp_path / "o")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_server_without_metrics_is_said_once(tmp_path):
    """A server with no /metrics: one note, and the export says why there is no series."""
    import asyncio

    from aiohttp import web

    from mmdatagen.loadgen.scrape import MetricsSampler

    async def main():
        app = web.Application()
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        s = MetricsSampler(f"http://127.0.0.1:{port}", 0.05, quiet=True)
        before = await s.start()
        await asyncio.sleep(0.2)
        after = await s.stop()
        await runner.cleanup()
        return before, after, s.series(None)

    before, after, series = asyncio.run(main())
    assert before is None and after is None
    assert series == {"available": False, "url": series["url"],
                      "reason": "the server has no /metrics (or it did not answer)"}


# -- bench / compare with goodput and the report in a real browser ------------------------------
def test_bench_report_in_headless_chromium(tmp_path, run_cli):
    data = _dataset(tmp_path, n=16, distinct=4)
    out = tmp_path / "b"
    res = run_cli("bench", "--input-file", data, "--profile", "zero-delay", "--concurrency", "4",
                  "--streaming", "--extra-inputs", "max_tokens:6", "--goodput", "ttft:60000",
                  "e2el:60000", "--metrics-interval", "0.05", "--png", "--output-dir", out, "-q")
    assert res.exit_code == 0, res.output
    ex = orjson.loads((out / "profile_export_mmdatagen.json").read_bytes())
    assert ex["good_request_count"]["avg"] == 16
    assert (out / "report.html").is_file()
    assert (out / "plots" / "cdf_ttft.png").read_bytes()[:4] == b"\x89PNG"
    page = inspect_page(out / "report.html", """JSON.stringify({
        rendered: document.body.dataset.rendered,
        text: document.body.innerText,
        svgs: document.querySelectorAll('svg.chart').length,
        cells: Array.from(document.querySelectorAll('td[data-metric]')).map(
            td => [td.dataset.metric, td.dataset.value])})""")
    assert page["errors"] == []
    assert all(u.startswith(("file:", "data:", "about:")) for u in page["requested"]), \
        page["requested"]
    v = orjson.loads(page["value"])
    assert v["rendered"] == "1" and v["svgs"] >= 4
    cells = dict(v["cells"])
    for key, tag, stat in (("output_token_throughput.avg", "output_token_throughput", "avg"),
                           ("time_to_first_token.p50", "time_to_first_token", "p50"),
                           ("goodput.avg", "goodput", "avg"),
                           ("request_count.avg", "request_count", "avg")):
        assert float(cells[key]) == pytest.approx(ex[tag][stat]), key
    assert ex["server_stages"]["available"]  # the simulator's stages, shown as the export has them
    assert float(cells["stages.requests"]) == ex["server_stages"]["requests"] == 16
    assert float(cells["stages.ttft"]) == pytest.approx(ex["server_stages"]["avg_ms"]["ttft"])
    # the numbers are shown as the page's text, formatted as the export holds them
    assert f"{ex['output_token_throughput']['avg']:,.2f}" in v["text"]
    assert f"{ex['request_count']['avg']:,}" in v["text"]
    hit = ex["image_cache"]["measured"]["hit_rate"] * 100
    assert f"{hit:,.2f}" in v["text"]

    # an older export without aggregates: compare rebuilds them from its records.jsonl
    old = tmp_path / "old"
    old.mkdir()
    (old / "records.jsonl").write_bytes((out / "records.jsonl").read_bytes())
    stripped = {k: v for k, v in ex.items() if k not in ("timeline", "distributions")}
    (old / "profile_export_mmdatagen.json").write_bytes(orjson.dumps(stripped))
    # compare the runs under a goodput objective nobody meets
    res = run_cli("compare", out, old, "--goodput", "ttft:0.000001", "--output-dir",
                  tmp_path / "cmp")
    assert res.exit_code == 0, res.output
    table = orjson.loads((tmp_path / "cmp" / "comparison.json").read_bytes())
    good = {r["metric"]: r for r in table["rows"]}["Good requests"]
    assert good["a"] == 0 and good["b"] == 0
    page = inspect_page(tmp_path / "cmp" / "report.html", """JSON.stringify({
        table: document.body.innerText.includes('A/B table'),
        timelines: Array.from(document.querySelectorAll('svg.chart')).filter(
            s => s.id.endsWith('_inflight')).length})""")
    assert page["errors"] == []
    assert orjson.loads(page["value"]) == {"table": True, "timelines": 2}
