"""Simulator server hot path: requests/s on the zero-delay profile (short non-streaming text,
concurrency 32), plus streamed requests/s, from one client process (the loader's raw client).

    python benchmarks/bench_sim_server.py [--seconds 5] [--concurrency 32]
"""
from __future__ import annotations

import argparse
import asyncio
import time

import orjson

from mmdatagen.loadgen.client import RawClient, Target
from mmdatagen.settings.sim import Simulator
from mmdatagen.sim.embedded import EmbeddedServer

MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"


async def load(url: str, body: bytes, concurrency: int, seconds: float, streaming: bool) -> tuple[int, int]:
    client = RawClient(Target.parse(url), timeout_s=30, headers={})
    done = errors = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, errors
        while time.perf_counter() < stop:
            res = await client.request("/v1/chat/completions", body, "", streaming=streaming)
            done += 1
            errors += res.error is not None

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return done, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with EmbeddedServer(Simulator().with_values({"profile": "zero-delay", "cache_size": 1.0})
                        ) as srv:
        for streaming in (False, True):
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 20}],
                    "max_tokens": 16, "ignore_eos": True, "stream": streaming}
            raw = orjson.dumps(body)
            rates = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                n, err = runner(load(srv.url, raw, a.concurrency, a.seconds, streaming))
                rates.append(n / (time.perf_counter() - t))
                assert err == 0, f"{err} errors"
            kind = "streaming (16 chunks)" if streaming else "non-streaming"
            print(f"zero-delay {kind}, concurrency {a.concurrency}: "
                  + ", ".join(f"{r:,.0f}" for r in rates) + f" req/s (best {max(rates):,.0f})")


if __name__ == "__main__":
    main()
