"""Seed A embedding-cache A/B on the simulator, against the published numbers.

    python benchmarks/bench_sim_seed_a.py                  # virtual time, seeds 0..2 (seconds)
    python benchmarks/bench_sim_seed_a.py --real --time-scale 2   # also the real-time server

Virtual time runs ``mmdatagen.sim.virtual.simulate`` (the engine of ``mmdatagen simulate``);
``--real`` starts the simulator as a subprocess (``EmbeddedServer``) and drives it with a closed-loop client
(``mmdatagen.sim.probe``), dividing measured times by the time scale. ``--dataset`` uses a real
seed A file instead of the seed-A-shaped ones written by the generator
(``tests/sim_datasets.py``: ``mmdatagen pool`` with solid-colour images, seeds 0..N-1).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from mmdatagen.metrics import build_export
from mmdatagen.sim.profile import load_profile
from mmdatagen.sim.virtual import OutputPolicy, load_turns, simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim_datasets import write_pool_dataset  # the tests' seed-A builder

PUBLISHED = {
    "on": {"tps": 3575.6, "ttft": 526.0, "ttft_p50": 356.8, "itl": 14.1, "latency": 2630.0},
    "off": {"tps": 3072.3, "ttft": 727.5, "ttft_p50": 510.8, "itl": 15.5, "latency": 3035.7},
}
NAMES = {"tps": "Output TPS (tok/s)", "ttft": "TTFT avg (ms)", "ttft_p50": "TTFT p50 (ms)",
         "itl": "ITL avg (ms)", "latency": "Request latency avg (ms)"}
CACHE = {"on": 10.0, "off": 0.0}


def summarise(export: dict, scale: float = 1.0) -> dict[str, float]:
    return {"tps": export["output_token_throughput"]["avg"] * scale,
            "ttft": export["time_to_first_token"]["avg"] / scale,
            "ttft_p50": export["time_to_first_token"]["p50"] / scale,
            "itl": export["inter_token_latency"]["avg"] / scale,
            "latency": export["request_latency"]["avg"] / scale}


def table(label: str, got: dict[str, dict[str, float]]) -> float:
    print(f"\n{label}")
    print(f"{'Metric':26} {'ON':>9} {'pub':>9} {'err':>7}   {'OFF':>9} {'pub':>9} {'err':>7}")
    worst = 0.0
    for k, name in NAMES.items():
        cells = []
        for side in ("on", "off"):
            v, p = got[side][k], PUBLISHED[side][k]
            err = (v / p - 1) * 100
            worst = max(worst, abs(err))
            cells.append(f"{v:9.1f} {p:9.1f} {err:+6.1f}%")
        print(f"{name:26} {cells[0]}   {cells[1]}")
    print(f"worst |error| {worst:.1f} %  (target <= 15 %)")
    return worst


def run_virtual(path: Path, profile, requests: int, concurrency: int) -> dict:
    turns = load_turns(path, profile)
    out = {}
    for side, gb in CACHE.items():
        res = simulate(turns, profile, gb, concurrency, requests, 3, OutputPolicy(150, 150, True))
        out[side] = summarise(build_export(res.records, input_config={}))
        c = res.engine.cache.counters()
        out[side]["hit_rate"] = c["hits"] / max(1, c["queries"])
    return out


def run_real(path: Path, profile_name: str, requests: int, concurrency: int,
             scale: float) -> dict:
    from mmdatagen.settings.sim import Simulator
    from mmdatagen.sim.embedded import EmbeddedServer
    from mmdatagen.sim.probe import chat_bodies, drive

    prof = load_profile(profile_name)
    bodies = chat_bodies(path, prof.served_model_name, requests + 3,
                         {"max_tokens": 150, "min_tokens": 150, "ignore_eos": True})
    out = {}
    for side, gb in CACHE.items():
        spec = Simulator().with_values({"profile": profile_name, "cache_size": gb,
                                        "time_scale": scale})
        with EmbeddedServer(spec) as srv:
            recs = asyncio.run(drive(srv.url, bodies, concurrency, warmup=3))
        out[side] = summarise(build_export(recs, input_config={}), scale)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="qwen3-vl-30b-gb200")
    ap.add_argument("--dataset", type=Path, default=None)
    ap.add_argument("--seeds", type=int, default=3, help="built-in datasets with seeds 0..N-1")
    ap.add_argument("--size", default="640x480")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--real", action="store_true", help="also run the real-time server")
    ap.add_argument("--time-scale", type=float, default=2.0)
    a = ap.parse_args()
    prof = load_profile(a.profile)
    w, h = (int(x) for x in a.size.split("x"))
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        paths = [a.dataset] if a.dataset else []
        for seed in range(0 if a.dataset else a.seeds):
            p = Path(tmp) / f"seed_a_{seed}.jsonl"
            write_pool_dataset(p, 1000, 200, (w, h), 400, seed)
            paths.append(p)
        for p in paths:
            got = run_virtual(p, prof, a.requests, a.concurrency)
            worst = max(worst, table(f"virtual time, {p.name} (hit rate ON "
                                     f"{got['on']['hit_rate']:.1%})", got))
        if a.real:
            got = run_real(paths[0], a.profile, a.requests, a.concurrency, a.time_scale)
            table(f"real time (time scale {a.time_scale:g}, times divided by it), {paths[0].name}",
                  got)
    return 0 if worst <= 15.0 else 1


if __name__ == "__main__":
    sys.exit(main())
