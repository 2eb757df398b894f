"""Class 1, stopping: SIGTERM is handled like Ctrl-C by every long-running command; workers and
the embedded simulator die with their parent, even when it is SIGKILLed; nothing is left."""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from .helpers import (
    STOP_BOUND_S,
    alive,
    children,
    kill_tree,
    listing,
    start,
    stop,
    survivors,
    wait_until,
)
from .hostile import hostile_server

BIG_POOL = ["pool", "-n", 20000, "--pool-size", 20000, "-o", "p.jsonl", "-q"]


def _staging_has_images(folder: Path) -> bool:
    return any(any(d.iterdir()) for d in folder.glob(".p_images.*.part") if d.is_dir())


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_generator_stops_promptly_and_removes_everything(tmp_path, sig, code):
    proc = start(*BIG_POOL, cwd=tmp_path)
    try:
        wait_until(lambda: _staging_has_images(tmp_path), 60, "the first images")
        workers = children(proc.pid)
        assert workers
        rc, seconds, err = stop(proc, sig)
    finally:
        kill_tree(proc)
    assert rc == code and "Traceback" not in err
    assert seconds < STOP_BOUND_S  # queued images are cancelled, not rendered
    assert survivors(workers) == []
    assert listing(tmp_path) == []  # no JSONL, no .part, no staging folder, no lock


def test_sliding_window_sigterm_leaves_no_part_file(tmp_path):
    proc = start("sliding-window", "--users", 150, "-o", "sw.jsonl", "-q", "--tokenizer", "words",
                 "--text-tokens", 50, cwd=tmp_path)
    try:
        wait_until(lambda: any(p.stat().st_size > 0 for p in tmp_path.glob(".sw.jsonl.*.part")),
                   60, "rows being written")
        workers = children(proc.pid)
        rc, _, err = stop(proc, signal.SIGTERM)
    finally:
        kill_tree(proc)
    assert rc == 143 and "Traceback" not in err
    assert survivors(workers) == [] and listing(tmp_path) == []


def test_workers_die_with_a_sigkilled_parent_and_the_next_run_cleans_up(tmp_path):
    proc = start(*BIG_POOL, cwd=tmp_path)
    try:
        wait_until(lambda: _staging_has_images(tmp_path), 60, "the first images")
        workers = children(proc.pid)
        proc.kill()
        proc.wait()
        assert survivors(workers) == []
    finally:
        kill_tree(proc)
    assert any(name.endswith(".part") for name in listing(tmp_path))  # SIGKILL cannot clean up
    small = start("pool", "-n", 20, "--pool-size", 5, "-o", "p.jsonl", "-q", "--force",
                  cwd=tmp_path)
    assert small.wait(120) == 0
    # holding the output's lock, the next run removes what the killed one left
    assert not [n for n in listing(tmp_path) if n.endswith((".part", ".old", ".lock"))]


def _sim_started(proc) -> list[int]:
    return [p for p in children(proc.pid) if alive(p)]


def test_bench_sigterm_writes_partial_export_and_stops_the_simulator(tmp_path, small_dataset):
    proc = start("bench", "--input-file", small_dataset, "--request-count", 100000,
                 "--concurrency", 4, "-q", "--output-dir", "out", cwd=tmp_path)
    try:
        wait_until(lambda: _sim_started(proc), 60, "the embedded simulator")
        sim = _sim_started(proc)
        time.sleep(1.0)  # any moment must do; this one is usually mid-run
        rc, seconds, err = stop(proc, signal.SIGTERM)
    finally:
        kill_tree(proc)
    assert "Traceback" not in err and rc == 143
    assert seconds < STOP_BOUND_S
    assert survivors(sim) == []
    export = orjson.loads((tmp_path / "out" / "profile_export_mmdatagen.json").read_bytes())
    assert export["was_cancelled"] is True
    assert (tmp_path / "out" / "records.jsonl").is_file()


def test_embedded_simulator_dies_with_a_sigkilled_bench(tmp_path, small_dataset):
    proc = start("bench", "--input-file", small_dataset, "--request-count", 100000,
                 "--concurrency", 2, "-q", "--output-dir", "out", cwd=tmp_path)
    try:
        wait_until(lambda: _sim_started(proc), 60, "the embedded simulator")
        sim = _sim_started(proc)
        proc.kill()
        proc.wait()
        assert survivors(sim) == []
    finally:
        kill_tree(proc)


def test_ctrl_c_during_first_metrics_scrape_still_exports(tmp_path, small_dataset):
    scraped = threading.Event()

    def never_answer_metrics(conn) -> None:  # /metrics hangs; nothing else is asked before it
        scraped.set()
        conn.recv(1)

    with hostile_server(never_answer_metrics) as url:
        proc = start("bench", "--input-file", small_dataset, "--url", url, "--model", "m",
                     "-q", "--output-dir", "out", cwd=tmp_path)
        try:
            assert scraped.wait(60)
            rc, _, err = stop(proc, signal.SIGINT)
        finally:
            kill_tree(proc)
    assert rc == 130 and "Traceback" not in err
    export = orjson.loads((tmp_path / "out" / "profile_export_mmdatagen.json").read_bytes())
    assert export["was_cancelled"] is True and export["run_info"]["requests_started"] == 0


def test_sigterm_before_the_first_request_still_exports(tmp_path, small_dataset):
    """A sharded worker stopped while it waits for its --start-at (its dataset read, the
    server's clock probed): exit 143 and an empty, cancelled export. CI once sent the
    signal this early (a loaded machine): the run ended without one."""
    probed = threading.Event()

    def models(conn) -> None:  # the clock probes: answered, with the server's Date
        body = b'{"data": []}'
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: "
                     + time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()).encode()
                     + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        probed.set()

    with hostile_server(models) as url:
        proc = start("bench", "--input-file", small_dataset, "--url", url, "--model", "m",
                     "--concurrency", 2, "--num-shards", 2, "--shard-index", 0, "--start-at",
                     int(time.time()) + 120, "-q", "--output-dir", "out", cwd=tmp_path)
        try:
            assert probed.wait(60)
            time.sleep(1.0)  # the probes done: waiting for the start
            rc, seconds, err = stop(proc, signal.SIGTERM)
        finally:
            kill_tree(proc)
    assert rc == 143 and "Traceback" not in err and seconds < STOP_BOUND_S
    export = orjson.loads((tmp_path / "out" / "profile_export_mmdatagen.json").read_bytes())
    assert export["was_cancelled"] is True and export["run_info"]["requests_started"] == 0


@pytest.mark.parametrize("command", ["analyze", "simulate"])
def test_other_long_commands_stop_on_sigterm(tmp_path, small_dataset, command):
    """SIGTERM reaches analyze and simulate as Ctrl-C does: exit 143, no traceback."""
    args = {"analyze": ["analyze", "--workload", "pool", "--num-requests", "1000:200000:1000",
                        "--cache-images", "100"],
            "simulate": ["simulate", small_dataset, "--request-count", 10_000_000, "-q",
                         "--profile", "zero-delay"]}[command]
    proc = start(*args, cwd=tmp_path)
    try:
        wait_until(lambda: proc.poll() is not None or _cpu_ticks(proc.pid) > 50, 60, "work")
        if proc.poll() is not None:
            pytest.fail(f"{command} ended before the signal: {proc.stderr.read().decode()[:300]}")
        rc, seconds, err = stop(proc, signal.SIGTERM)
    finally:
        kill_tree(proc)
    assert rc == 143 and "Traceback" not in err and seconds < STOP_BOUND_S


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def test_serve_rejects_ready_file_in_missing_folder(tmp_path):
    from .helpers import one_error_line, run

    res = run("serve", "--port", 0, "--ready-file", tmp_path / "nope" / "r.json", cwd=tmp_path)
    assert res.returncode == 2 and "does not exist" in one_error_line(res.stderr)
    assert listing(tmp_path) == []


def test_serve_stops_on_sigterm(tmp_path):
    proc = start("serve", "--port", 0, "--profile", "zero-delay", cwd=tmp_path)
    try:
        line = proc.stdout.readline().decode()
        assert "listening on" in line
        rc, seconds, err = stop(proc, signal.SIGTERM)
    finally:
        kill_tree(proc)
    assert rc == 143 and seconds < STOP_BOUND_S and "Traceback" not in err

