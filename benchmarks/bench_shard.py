"""Sharded load workers and merge-runs, measured in one run (ratios, not timed tests).

    python benchmarks/bench_shard.py                 # all three parts
    python benchmarks/bench_shard.py --skip rate     # only merge-runs and client-added TTFT

1. rate: requests/s that 1 and 2 load workers (``bench --num-shards``) sustain against a sink
   server that reads each request and answers at once (a few bytes of SSE), with small requests
   (one 32x32 inline image, 32 words) and high concurrency, so the loader's own work is what
   limits. Goal: 2 workers >= 1.8 x 1 (bounded by cores, not by coordination). Printed beside
   the rates: the CPU microseconds per request of the loaders and of the server inside the
   benchmark's window (sampled from /proc, apart from start-up and export writing), the cores
   they kept busy, and the bound those numbers set on 2 idle cores. The server runs on the
   same 2 cores: 2 workers can reach 2x only if the server takes none. Last, the host's own
   scaling: how much more a CPU-bound Python loop gets done in two processes than in one.
2. merge: ``mmdatagen merge-runs`` over 1,000,000 records from 4 workers
   (``benchmarks/bench_merge.py``: wall and CPU seconds, peak RSS and where the CPU went,
   without and with the cache items of the merged prediction). Goal: <= 10 s, <= 1 GB.
3. ttft: client-added TTFT (client TTFT minus the server's own, from the simulator's header)
   of a 2-worker merged run beside a single-process run of the same benchmark on ``serve``.

The machine is shared: the load average is printed with every measurement, and CPU seconds
beside wall seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import bench_merge  # the merge part: benchmarks/bench_merge.py

PY = [sys.executable, "-m", "mmdatagen"]
MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"
SINK = r'''
import asyncio, sys, time
BODY = (b"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"index\":0}]}\n\n"
        b"data: [DONE]\n\n")
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n"
class Sink(asyncio.Protocol):
    def connection_made(self, transport):
        self.t, self.buf = transport, b""
    def data_received(self, data):
        self.buf += data
        while (i := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:i].lower()
            j = head.find(b"content-length:")
            n = int(head[j + 15:].split(b"\r\n", 1)[0]) if j >= 0 else 0
            if len(self.buf) < i + 4 + n:
                return
            self.buf = self.buf[i + 4 + n:]
            self.t.write(HEAD % len(BODY) + b"x-mmdatagen-server-time-ns: %d\r\n\r\n"
                         % time.time_ns() + BODY)
async def main():
    srv = await asyncio.get_running_loop().create_server(Sink, "127.0.0.1", 0)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await srv.serve_forever()
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
'''
def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def _run(args: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, *map(str, args)], check=True, capture_output=True, text=True,
                          timeout=1800, **kw)


def _cpu_of(pid: int) -> float:
    """CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Sampler(threading.Thread):
    """CPU seconds of some processes every 20 ms (Linux /proc), so the CPU they spent inside
    the benchmark's window (from its export) is read apart from start-up and export writing."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids, self.rows, self.done = pids, [], threading.Event()
        self.last = [0.0] * len(pids)

    def _cpu(self, k: int) -> float:
        try:
            self.last[k] = _cpu_of(self.pids[k])
        except (OSError, IndexError, ValueError):  # exited and reaped: its last value
            pass
        return self.last[k]

    def run(self) -> None:
        while not self.done.is_set():
            self.rows.append((time.time(), [self._cpu(k) for k in range(len(self.pids))]))
            self.done.wait(0.02)

    def between(self, t0: float, t1: float) -> list[float]:
        """Each process's CPU seconds from Unix time t0 to t1 (interpolated samples)."""
        import numpy as np

        times = np.array([t for t, _ in self.rows])
        cpu = np.array([c for _, c in self.rows])
        return [float(np.interp(t1, times, cpu[:, k]) - np.interp(t0, times, cpu[:, k]))
                for k in range(len(self.pids))]


def _window(export: dict) -> tuple[float, float]:
    """The benchmark's first request start and last response end, Unix seconds."""
    from datetime import datetime

    return (datetime.fromisoformat(export["start_time"]).timestamp(),
            datetime.fromisoformat(export["end_time"]).timestamp())


def _workers(n: int, common: list, out: Path, sink_pid: int | None = None
             ) -> tuple[list[float], float, Path, _Sampler]:
    """n workers of one benchmark started together (``--start-at``; one plain bench for n=1):
    each worker's CPU seconds from the common start to its exit (``os.wait4``), the server's
    over the same time (``sink_pid``), the folder of the (merged) export, and the CPU samples
    of the workers and the server (the server last)."""
    start = time.time() + 8  # cold processes on a busy machine
    shard = (lambda k: ["--num-shards", n, "--shard-index", k]) if n > 1 else (lambda k: [])
    procs = [subprocess.Popen([*PY, "bench", *map(str, [*common, *shard(k), "--start-at", start,
                                                         "--output-dir", out / f"w{k}"])])
             for k in range(n)]
    sampler = _Sampler([p.pid for p in procs] + ([sink_pid] if sink_pid else []))
    sampler.start()
    time.sleep(max(0.0, start - time.time()))
    at_start = [_cpu_of(p.pid) for p in procs]
    server = _cpu_of(sink_pid) if sink_pid else 0.0
    cpu = []
    try:
        for p, c0 in zip(procs, at_start):
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            assert p.returncode == 0, f"worker exited {p.returncode}"
            cpu.append(usage.ru_utime + usage.ru_stime - c0)
    finally:
        sampler.done.set()
        sampler.join()
    server = (_cpu_of(sink_pid) - server) if sink_pid else 0.0
    if n == 1:
        return cpu, server, out / "w0", sampler
    _run(["merge-runs", *(out / f"w{k}" for k in range(n)), "--output-dir", out / "merged",
          "-q", "--no-report"])
    return cpu, server, out / "merged", sampler


def _rate_line(n: int, ex: dict, cpu: list[float], server: float, sampler: _Sampler,
               load: str) -> tuple[float, float]:
    """Print one rate row; return the loader's and the server's CPU microseconds per request
    inside the benchmark's window."""
    rate, span = ex["request_throughput"]["avg"], ex["benchmark_duration"]["avg"]
    done = ex["request_count"]["avg"]
    inside = sampler.between(*_window(ex))
    loader_us, server_us = sum(inside[:n]) / done * 1e6, inside[n] / done * 1e6
    print(f"{n} worker{'s' if n > 1 else ' '}: {rate:7.0f} req/s over {span:.2f} s ({done} "
          f"requests, {ex['error_request_count']['avg']} failed); in the run: CPU per request "
          f"loader {loader_us:.1f} us + server {server_us:.1f} us, cores busy: loaders "
          f"{sum(inside[:n]) / span:.2f} + server {inside[n] / span:.2f} of 2; start to exit: "
          f"loader CPU {' + '.join(f'{c:.2f}' for c in cpu)} s, server {server:.2f} s; "
          f"{_load()} (was {load})")
    return loader_us, server_us


SPIN = """
import time
t = time.perf_counter()
x = 0
for i in range(12_000_000):
    x += i * i % 7
print(time.perf_counter() - t)
"""


def host_scaling() -> float:
    """How much more CPU-bound work two processes do than one on this host (2.00: two cores
    that do not slow each other; shared physical cores or a busy host give less)."""
    def spin(n: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE,
                                  text=True) for _ in range(n)]
        return max(float(p.communicate()[0]) for p in procs)

    one, two = spin(1), spin(2)
    return 2 * one / two


def part_rate(tmp: Path, requests: int, concurrency: int) -> None:
    data = tmp / "small.jsonl"
    _run(["pool", "-n", 256, "--pool-size", 16, "--image-size", "32x32", "--image-content",
          "solid", "--delivery", "data-url", "--text-tokens", 32, "--tokenizer", "words",
          "-o", data, "-q"])
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None
    url = f"http://127.0.0.1:{sink.stdout.readline().strip()}"
    common = ["--input-file", data, "--url", url, "--model", MODEL, "--concurrency",
              concurrency, "--request-count", requests, "--no-predict", "-q", "--no-report"]
    rates, us = {}, {}
    try:
        for n in (1, 2):
            load = _load()
            cpu, server, folder, sampler = _workers(n, common, tmp / f"rate{n}", sink.pid)
            ex = json.loads((folder / "profile_export_mmdatagen.json").read_text())
            rates[n] = ex["request_throughput"]["avg"]
            us[n] = _rate_line(n, ex, cpu, server, sampler, load)
    finally:
        sink.terminate()
        sink.wait(timeout=30)
    print(f"ratio 2 workers / 1 worker: {rates[2] / rates[1]:.2f} (goal >= 1.8); loader CPU per "
          f"request, 2 workers / 1: {us[2][0] / us[1][0]:.2f} (1.00: no cost of coordination)")
    # on 2 idle cores: 1 worker is bound by its own core (the server runs on the other one),
    # 2 workers by both cores shared with the server
    (l1, s1), (l2, s2) = us[1], us[2]
    print(f"bounded by cores: per request the server spends {s1:.1f} us of CPU beside the "
          f"loader's {l1:.1f} us (1 worker; 2 workers: {s2:.1f} + {l2:.1f} us); on 2 idle "
          f"cores one worker reaches 1e6 / {l1:.1f} = {1e6 / l1:.0f} req/s and two reach "
          f"2e6 / ({l2:.1f} + {s2:.1f}) = {2e6 / (l2 + s2):.0f} req/s: at most "
          f"{2 * l1 / (l2 + s2):.2f} x (2 / (1 + s) = {2 / (1 + s1 / l1):.2f} with s = "
          f"{s1 / l1:.2f}, the server's CPU per loader CPU)")
    load = _load()
    print(f"this host's cores: two CPU-bound Python processes (no I/O, nothing shared) do "
          f"{host_scaling():.2f} x the work of one ({load}; 2.00: cores that do not slow each "
          f"other)")


def part_ttft(tmp: Path) -> None:
    data = tmp / "seed.jsonl"
    _run(["pool", "-n", 400, "--pool-size", 80, "-o", data, "-q"])
    ready = tmp / "ready.json"
    serve = subprocess.Popen([*PY, "serve", "--port", "0", "--ready-file", str(ready)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not ready.exists() or not ready.read_text().strip().endswith("}"):
            assert serve.poll() is None, "serve exited"
            time.sleep(0.1)
        url = json.loads(ready.read_text())["url"]
        common = ["--input-file", data, "--url", url, "--model", MODEL, "--concurrency", 32,
                  "--extra-inputs", "max_tokens:16", "-q", "--no-report", "--reset-cache"]
        _workers(1, common, tmp / "single")
        _workers(2, common, tmp / "two")
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    for name, folder in (("single", tmp / "single" / "w0"), ("merged", tmp / "two" / "merged")):
        ex = json.loads((folder / "profile_export_mmdatagen.json").read_text())
        c = ex.get("client_added_ttft") or {}
        print(f"client-added TTFT, {name:6}: avg {c.get('avg', float('nan')):.2f} ms, "
              f"p50 {c.get('p50', float('nan')):.2f} ms, p99 {c.get('p99', float('nan')):.2f} ms"
              f" (TTFT p50 {ex['time_to_first_token']['p50']:.1f} ms, "
              f"{ex['request_count']['avg']} requests)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", nargs="*", default=[], choices=["rate", "merge", "ttft"])
    ap.add_argument("--requests", type=int, default=20_000, help="rate: requests per run")
    ap.add_argument("--concurrency", type=int, default=64, help="rate: total concurrency")
    ap.add_argument("--records", type=int, default=1_000_000, help="merge: records")
    ap.add_argument("--no-items", action="store_true", help="merge: skip the cache items run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        parts = (("rate", lambda: part_rate(tmp / "rate", args.requests, args.concurrency)),
                 ("merge", lambda: bench_merge.part_merge(tmp / "merge", args.records,
                                                          not args.no_items)),
                 ("ttft", lambda: part_ttft(tmp / "ttft")))
        for name, part in parts:
            if name not in args.skip:
                (tmp / name).mkdir()
                part()
    return 0


if __name__ == "__main__":
    sys.exit(main())
