"""CLI entry points: serve as a subprocess (EmbeddedServer), simulate, bad input -> exit 2."""
from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request

import orjson
import pytest
from sim_helpers import MODEL, png_url

from mmdatagen.errors import UserError
from mmdatagen.settings.sim import Simulator
from mmdatagen.sim.embedded import EmbeddedServer


def test_embedded_server_serves_and_stops_cleanly():
    srv = EmbeddedServer(Simulator().with_values({"profile": "zero-delay", "cache_size": 1.0}))
    with srv:
        assert srv.url.startswith("http://127.0.0.1:")
        body = orjson.dumps({"model": MODEL, "max_tokens": 3, "ignore_eos": True,
                             "messages": [{"role": "user", "content": [
                                 {"type": "image_url", "image_url": {"url": png_url()}}]}]})
        for expect in ("1", "0"):  # the repeat is served (by vLLM's encoder cache in front)
            req = urllib.request.Request(srv.url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req) as resp:
                assert resp.headers["x-mmdatagen-image-misses"] == expect
                assert json.loads(resp.read())["usage"]["completion_tokens"] == 3
        proc = srv.proc
    assert proc.returncode == 143  # SIGTERM -> a clean stop, with the signal's exit code
    assert srv.proc is None


def test_embedded_server_reports_bad_profile():
    with pytest.raises(UserError, match="failed to start"):
        EmbeddedServer(Simulator().with_values({"profile": "no-such-profile"})).start()


@pytest.mark.parametrize("args,needle", [
    (["serve", "--profile", "nope"], "cannot find config"),
    (["serve", "--time-scale", "0"], "--time-scale"),
    (["serve", "--embedding-cache-gb", "-1"], "negative"),
    (["serve", "--fault-error-rate", "2"], "fault-error-rate"),
    (["serve", "--port", "70000"], "--port"),
    (["simulate", "missing.jsonl"], "does not exist"),
])
def test_bad_cli_input_is_one_line_exit_2(run_cli, args, needle):
    res = run_cli(*args)
    assert res.exit_code == 2
    assert needle in res.output and res.output.count("\n") <= 2


def test_simulate_cli_writes_exports(run_cli, tmp_path):
    data = tmp_path / "d.jsonl"
    img = png_url()
    data.write_bytes(b"".join(orjson.dumps({"text": "w " * 50, "image": img}) + b"\n"
                              for _ in range(6)))
    res = run_cli("simulate", data, "--concurrency", "2", "--warmup-request-count", "1",
                  "--extra-inputs", "max_tokens:5", "--extra-inputs", "ignore_eos:true",
                  "--output-dir", tmp_path / "out")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "profile_export_mmdatagen.json").read_text())
    assert doc["request_count"]["avg"] == 5  # one pass over 6 rows, the first one as warmup
    assert doc["output_sequence_length"]["avg"] == 5
    assert doc["input_config"]["mode"] == "simulate"
    assert len((tmp_path / "out" / "records.jsonl").read_text().splitlines()) == 6
    # Dynamo's two tiers: the five repeats are served by vLLM's encoder cache in front
    assert "0/1 hits" in res.output and "5 served first by vLLM's encoder cache" in res.output


def test_serve_sigint_subprocess(tmp_path):
    import subprocess
    import sys

    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "mmdatagen", "serve", "--port", "0",
                             "--profile", "zero-delay", "--ready-file", str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode()
        assert "listening on http://127.0.0.1:" in line and "not a language model" in line
        assert json.loads(ready.read_text())["port"] > 0
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 130  # Ctrl-C's code, as every command
        assert not ready.exists()  # a stopped server is not ready
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_with_streams_in_flight_exits_cleanly():
    import asyncio

    import aiohttp

    srv = EmbeddedServer(Simulator().with_values({"cache_size": 1.0}), grace=8.0).start()
    proc = srv.proc

    async def go():
        async with aiohttp.ClientSession() as s:
            async def one():
                body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                        "stream": True, "max_tokens": 5000, "ignore_eos": True}
                try:
                    async with s.post(srv.url + "/v1/chat/completions", json=body) as r:
                        async for _ in r.content:
                            pass
                except aiohttp.ClientError:
                    pass

            tasks = [asyncio.create_task(one()) for _ in range(4)]
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            await asyncio.gather(*tasks)

    try:
        asyncio.run(go())
        assert proc.wait(8) == 143  # not killed: a clean stop with requests in flight
    finally:
        srv.stop()


def test_simulate_cache_sweep(run_cli, tmp_path):
    from sim_datasets import write_pool_dataset

    data = tmp_path / "pool.jsonl"
    write_pool_dataset(data, 200, 40, (640, 480), 50, seed=2)
    res = run_cli("simulate", data, "--concurrency", "8", "--extra-inputs", "max_tokens:4",
                  "--extra-inputs", "ignore_eos:true", "--sweep-cache-gb", "0,0.02,1",
                  "--encoder-budget", "300", "--output-dir", tmp_path / "sw")
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]
    rates = [r["hit_rate"] for r in rows]
    # 40 of 200 first references miss; the rest hit Dynamo's tier unless vLLM's encoder cache
    # (one 640x480 image) in front served them first
    front = rows[2]["encoder_hits"]
    assert rates[0] == 0 and 0 < rates[1] < rates[2]
    assert rates[2] == pytest.approx(100 * (160 - front) / (200 - front))
    assert "Hit rate %" in res.output
    bad = run_cli("simulate", data, "--sweep-cache-gb", "a,b")
    assert bad.exit_code == 2 and "--cache-size has a bad value 'a'" in bad.output


def test_simulator_spec_round_trips_as_json_and_refuses_bad_values(tmp_path):
    from mmdatagen.settings.sim import Simulator

    spec = Simulator().with_values({"profile": "zero-delay", "cache_size": 2.5,
                                    "served_model_name": ("a", "b"), "model_path": tmp_path,
                                    "fault_seed": 7, "port": 0})
    assert Simulator.from_json(spec.to_json()) == spec
    for doc, needle in [(b'{"engine": {"max_running": 0}}', "max_running"),
                        (b'{"engine": {"nope": 1}}', "unknown simulator settings: nope"),
                        (b'{"other": {}}', "must be an object of"),
                        (b'{"faults": {"fault_stall_ms": NaN}}', "finite")]:
        with pytest.raises(UserError, match=needle):
            Simulator.from_json(doc)


def test_sim_args_override_only_the_flags_given():
    from mmdatagen.settings.sim import Simulator, parse_sim_args

    base = Simulator().with_values({"cache_size": 3.0, "time_scale": 2.0})
    got = parse_sim_args(["--max-running", "8", "--fault-error-rate=0.5"], base)
    assert (got.engine.max_running, got.faults.fault_error_rate) == (8, 0.5)
    assert (got.cache.cache_size, got.server.time_scale) == (3.0, 2.0)
    assert parse_sim_args([], base) is base


@pytest.mark.parametrize("arg,needle", [("--fault-error-rate=2", "--fault-error-rate must be"),
                                        ("--max-running=x", "not a valid integer"),
                                        ("--no-such-flag", "No such option"),
                                        ("--cache-size=-1", "--cache-size must not be negative")])
def test_bad_sim_arg_is_one_line_before_any_server_starts(run_cli, tmp_path, arg, needle):
    data = tmp_path / "d.jsonl"
    data.write_bytes(b'{"text": "hi"}\n')
    res = run_cli("bench", "--input-file", data, "-q", "--output-dir", tmp_path / "out",
                  f"--sim-arg={arg}")
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith("error: --sim-arg: ") and needle in res.output
    assert not (tmp_path / "out").exists()


def test_embedded_server_runs_its_typed_spec():
    """Settings reach the child as a Simulator spec: the faults and the cache size given."""
    from mmdatagen.settings.sim import Simulator

    spec = Simulator().with_values({"profile": "zero-delay", "cache_size": 0.0,
                                    "fault_error_rate": 1.0, "fault_error_status": 503})
    with EmbeddedServer(spec) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        req = urllib.request.Request(srv.url + "/v1/chat/completions",
                                     data=orjson.dumps({"model": MODEL, "max_tokens": 2,
                                                        "messages": [{"role": "user",
                                                                      "content": "hi"}]}),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req)
        assert err.value.code == 503
