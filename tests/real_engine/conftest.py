"""Fixtures of the real-engine conformance suite (marker ``real_engine``).

Session scope: the engine virtualenv (``setup_engine.py``), the tiny Qwen2-VL
(``build_tiny_qwen2vl.py``) and ONE vLLM server shared by every workload. Workloads use datasets
with different seeds, so their images are distinct from every earlier workload's; an earlier
workload's entries are then older than all of the new workload's and, in an LRU and in the encoder
cache's freeable list, are evicted first: hits of the new workload equal a cold cache's. Counters
are read as deltas and encoder runs between two log offsets.

Nothing here skips: a missing or broken engine fails the suite with the reason.

Collection: the fast suite (``pytest`` from the repository root) deselects these tests unless they
are asked for: a path inside tests/real_engine, ``-m real_engine``, or MMDATAGEN_REAL_ENGINE=1
(``make test`` runs them after the fast suite).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import servers, setup_engine
from .engine import CALIBRATION, RESULTS, SERVER, TIMINGS, VllmServer

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_engine: needs the real vLLM engine (tests/real_engine)")


def _wanted(config: pytest.Config) -> bool:
    if os.environ.get("MMDATAGEN_REAL_ENGINE") == "1":
        return True
    markexpr = config.getoption("markexpr", "") or ""
    if "real_engine" in markexpr and "not real_engine" not in markexpr:
        return True
    for arg in config.args:
        path = Path(arg.split("::", 1)[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [it for it in items if HERE in Path(str(it.path)).resolve().parents]
    for it in mine:
        it.add_marker(pytest.mark.real_engine)
    if mine and not _wanted(config):
        config.hook.pytest_deselected(items=mine)
        items[:] = [it for it in items if it not in mine]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "real engine timings")
        for k, v in TIMINGS.items():
            terminalreporter.write_line(f"{k}: {v:.1f} s")
    if CALIBRATION:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "calibration.json").write_text(json.dumps(CALIBRATION, indent=1))
        _calibration_summary(terminalreporter)
    if RESULTS:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "results.json").write_text(json.dumps(RESULTS, indent=1))
        terminalreporter.write_sep("-", "predicted vs engine (processor-cache hits; encoder runs)")
        terminalreporter.write_line("workload | conc | cache bytes | refs (videos) | reference "
                                    "(dispatch order / server order) | bench predicted | "
                                    "engine hits | encoder runs (reference)")
        for r in RESULTS:
            if "clips" in r:  # per-clip video tokens
                for c in r["clips"]:
                    terminalreporter.write_line(
                        f"{r['workload']}: {c['clip']}: tokens engine {c['engine_tokens']} / "
                        f"reference {c['reference_tokens']} / mmdatagen {c['mmdatagen_tokens']}; "
                        f"entry bytes reference {c['reference_entry_bytes']} / mmdatagen "
                        f"{c['mmdatagen_entry_bytes']}")
                continue
            terminalreporter.write_line(
                f"{r['workload']} | {r['concurrency']} | {r['processor_cache_bytes']} | "
                f"{r['references']} ({r.get('videos', 0)}) | {r['reference_hits']} / {r['reference_hits_server_order']} | "
                f"{r['bench_predicted_hits']} ({r.get('bench_predicted_cache')}) | "
                f"{r['engine_hits']} | {r['encoder_runs']} ({r['reference_encoder_runs']})")


def _calibration_summary(terminalreporter) -> None:
    terminalreporter.write_sep("-", "calibrated profile: held-out runs, predicted vs measured")
    terminalreporter.write_line("case | repeats | TTFT p50 ms: measured (each) / predicted "
                                "(band) / error / beyond the band / spread | req/s: the same")
    for row in CALIBRATION:
        cells = []
        for metric in ("ttft_p50", "throughput"):
            m = row[metric]
            low, high = m["band"]
            cells.append(f"{', '.join(f'{v:.2f}' for v in m['measured'])} / "
                         f"{m['predicted']:.2f} ({low:.2f}..{high:.2f}) / {m['error']:+.1%} / "
                         f"{m['beyond']:+.1%} / {m['spread']:.1%}"
                         + ("" if m.get("asserted", True) else " (reported only)"))
        terminalreporter.write_line(f"{row['case']} | {row['repeats']} | {cells[0]} | {cells[1]}")


def cache_root() -> Path:
    env = os.environ.get("MMDATAGEN_ENGINE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mmdatagen"


@pytest.fixture(scope="session")
def engine_python() -> Path:
    started = time.monotonic()
    try:
        py = setup_engine.ensure()
    except (setup_engine.SetupError, OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"the real-engine virtualenv could not be set up: {exc}", pytrace=False)
    TIMINGS["engine setup"] = time.monotonic() - started
    return py


@pytest.fixture(scope="session")
def tiny_model(engine_python: Path) -> Path:
    out = cache_root() / "tiny-qwen2vl-seed0"
    started = time.monotonic()
    proc = subprocess.run([str(engine_python), str(HERE / "build_tiny_qwen2vl.py"),
                           "--output", str(out), "--seed", "0"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if proc.returncode != 0:
        pytest.fail(f"building the tiny Qwen2-VL failed:\n{proc.stdout[-2000:]}\n"
                    f"{proc.stderr[-4000:]}", pytrace=False)
    TIMINGS["tiny model"] = time.monotonic() - started
    return out


ARTIFACTS = HERE.parent.parent / "artifacts" / "real-engine"  # git-ignored


def _shared_server(python: Path, model: Path) -> VllmServer:
    return VllmServer(python, model, ARTIFACTS / "vllm.log", **SERVER)


servers.register("vllm_server", setup_engine.ensure, _shared_server)


@pytest.fixture(scope="session")
def started(request: pytest.FixtureRequest, engine_python: Path,
            tiny_model: Path) -> Iterator[servers.Started]:
    """Every server some collected test needs (``servers.register``), started together when
    the first of them is asked for; each is stopped by its fixture, or at the session's end."""
    wanted = {n for item in request.session.items for n in getattr(item, "fixturenames", ())}
    group = servers.start_all(wanted & servers.KINDS.keys(), tiny_model)
    try:
        yield group
    finally:
        group.stop_all()


@pytest.fixture(scope="session")
def vllm_server(started: servers.Started) -> VllmServer:
    server = started.get("vllm_server")
    TIMINGS["server start"] = server.start_seconds or 0.0
    print(f"\nvLLM on {server.url}, log {server.log_path}", file=sys.stderr)
    return server
