"""Loader speed: request rate vs AIPerf, raw vs aiohttp client, client-added TTFT.

    python benchmarks/bench_loadgen.py [--requests 20000] [--aiperf PATH] [--repeat 2]

1. Request rate: short non-streaming text requests at concurrency 32 against a zero-delay
   server (a minimal uvloop HTTP/1.1 server in a subprocess, so it outpaces any client on the
   other core). Runs mmdatagen's raw client, its aiohttp client and, when installed, AIPerf
   (``--aiperf PATH``, ``$AIPERF`` or ``aiperf`` on PATH, e.g. from a separate virtualenv; it runs with
   ``--tokenizer builtin`` offline), interleaved, and prints ratios measured in this run.
2. Client-added TTFT (client TTFT - the server's ``x-mmdatagen-server-ttft-ns``) p50 at
   concurrency 64, streaming, against the minimal server answering 20 ms after the last request
   byte (its header = last byte in -> first byte out), with short bodies and with 2.6 MB image
   bodies (also at concurrency 1: at 64 such bodies saturate one core, so the figure there is
   mostly queueing behind other uploads); then the simulator's figure for reference.
3. The cycle collector (``--skip-gc`` skips it): streaming text requests at concurrency 16
   against the zero-delay server, each run in a fresh process, with the loader as it is (full
   collections held off among the requests, ``lifecycle.rare_full_collections``) and with that
   block replaced by nothing, interleaved: the TTFT maximum and p99 of each, and the ratio of
   the maxima (a full collection's pause lands in some request's TTFT).

Numbers are noisy on a shared 2-core machine: compare ratios within one run, repeat.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

# --------------------------------------------------------------------------------------------
# A minimal zero-delay OpenAI-ish server (runs in its own process: ``--serve PORT``)

_BODY = orjson.dumps({"id": "x", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok ok ok ok"},
     "finish_reason": "stop"}], "usage": {"prompt_tokens": 8, "completion_tokens": 4}})


def _sse_body() -> bytes:
    parts = [orjson.dumps({"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]})
             for i in range(4)]
    parts.append(orjson.dumps({"choices": [], "usage": {"prompt_tokens": 8,
                                                         "completion_tokens": 4}}))
    return b"".join(b"data: " + p + b"\n\n" for p in parts) + b"data: [DONE]\n\n"


class _ServerProto(asyncio.Protocol):
    """Keep-alive HTTP/1.1; answers at once, or (streaming) after ``delay_s`` to the first token.

    ``x-mmdatagen-server-ttft-ns`` = last request byte received -> first response byte written.
    """

    sse = _sse_body()
    delay_s = 0.0

    def connection_made(self, transport) -> None:
        self.t = transport
        self.buf = bytearray()
        self.need = -1  # total bytes of the current request once its head is parsed

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0:
                i = self.buf.find(b"\r\n\r\n")
                if i < 0:
                    return
                head = bytes(self.buf[:i]).lower()
                j = head.find(b"content-length:")
                n = 0
                if j >= 0:
                    k = head.find(b"\r\n", j)
                    n = int(head[j + 15:k if k > 0 else None])
                self.need = i + 4 + n
                self.body_at = i + 4
            if len(self.buf) < self.need:
                return
            t0 = time.perf_counter_ns()
            stream = self.buf.find(b'"stream":true', self.body_at, self.need) >= 0
            del self.buf[:self.need]
            self.need = -1
            if stream and self.delay_s > 0:
                asyncio.get_running_loop().call_later(self.delay_s, self._answer, True, t0)
            else:
                self._answer(stream, t0)

    def _answer(self, stream: bool, t0: int) -> None:
        if self.t.is_closing():
            return
        payload = self.sse if stream else _BODY
        ctype = b"text/event-stream" if stream else b"application/json"
        ttft = time.perf_counter_ns() - t0
        self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype +
                     b"\r\nx-mmdatagen-server-ttft-ns: %d\r\nContent-Length: %d\r\n\r\n"
                     % (ttft, len(payload)) + payload)


def serve(port: int, delay_ms: float = 0.0) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    _ServerProto.delay_s = delay_ms / 1000.0
    loop = asyncio.new_event_loop()
    srv = loop.run_until_complete(loop.create_server(_ServerProto, "127.0.0.1", port, backlog=1024))
    print("ready", flush=True)
    try:
        loop.run_forever()
    finally:
        srv.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MiniServer:
    def __init__(self, delay_ms: float = 0.0) -> None:
        self.delay_ms = delay_ms

    def __enter__(self) -> MiniServer:
        self.port = _free_port()
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port),
                                      str(self.delay_ms)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# --------------------------------------------------------------------------------------------
# Runs

def _text_dataset(path: Path, n: int = 1000) -> Path:
    with open(path, "wb") as fh:
        for i in range(n):
            fh.write(orjson.dumps({"text": f"short prompt number {i}"}) + b"\n")
    return path


def _image_dataset(path: Path, n: int = 16, target_mb: float = 2.6) -> Path:
    """Rows whose body is ~target_mb MB: one noise JPEG data URL each (distinct images)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    side = 900
    with open(path, "wb") as fh:
        for i in range(n):
            while True:
                arr = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
                buf = io.BytesIO()
                Image.fromarray(arr).save(buf, format="JPEG", quality=85, subsampling=0)
                url = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
                if i or abs(len(url) / 1e6 - target_mb) < 0.15:
                    break
                side = int(side * (target_mb * 1e6 / len(url)) ** 0.5)
            fh.write(orjson.dumps({"text": "describe the image", "image": url}) + b"\n")
    return path


def run_ours(path: Path, url: str, out: Path, *, requests: int, concurrency: int,
             client: str = "raw", streaming: bool = False, model: str = "m",
             warmup: int = 100) -> dict:
    """One mmdatagen run in this process (the server is another process)."""
    from mmdatagen.loadgen.run import run_bench
    from mmdatagen.settings.load import BenchTarget, Load
    from mmdatagen.settings.run import BenchRun

    load = Load(input_file=path, model=model, concurrency=concurrency, request_count=requests,
                warmup_request_count=warmup, streaming=streaming, quiet=True, no_predict=True,
                http_client=client, extra_inputs=("max_tokens:4",) if streaming else ())
    return run_bench(BenchRun(load, BenchTarget(url=url, output_dir=out))).export


def find_aiperf(arg: str | None) -> str | None:
    for cand in (arg, os.environ.get("AIPERF"), shutil.which("aiperf")):
        if cand and Path(cand).exists():
            return cand
    return None


_TOKENIZER_SNIPPET = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


def local_tokenizer(binary: str, where: Path) -> str:
    """A tiny offline word-level tokenizer for AIPerf (its 'builtin' one downloads a BPE file)."""
    python = Path(binary).parent / "python"
    if not python.exists():
        return "builtin"
    proc = subprocess.run([str(python), "-c", _TOKENIZER_SNIPPET, str(where)],
                          capture_output=True, text=True, timeout=120)
    return str(where) if proc.returncode == 0 else "builtin"


def run_aiperf(binary: str, path: Path, url: str, out: Path, *, requests: int,
               concurrency: int, tokenizer: str) -> float | None:
    cmd = [binary, "profile", "--model", "m", "--url", url, "--endpoint-type", "chat",
           "--custom-dataset-type", "single_turn", "--input-file", str(path),
           "--concurrency", str(concurrency), "--request-count", str(requests),
           "--warmup-request-count", "100", "--tokenizer", tokenizer, "--ui-type", "none",
           "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=out.parent)
    exports = sorted(out.glob("**/profile_export_aiperf.json"))
    if proc.returncode != 0 or not exports:
        print(f"  AIPerf failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
        return None
    doc = orjson.loads(exports[-1].read_bytes())
    return float(doc["request_throughput"]["avg"])


def section_rate(args, tmp: Path) -> None:
    print(f"== request rate: non-streaming short text, concurrency {args.concurrency}, "
          f"{args.requests} requests, zero-delay minimal server")
    data = _text_dataset(tmp / "text.jsonl")
    aiperf = find_aiperf(args.aiperf)
    if aiperf is None:
        print("  AIPerf not installed: skipping that half (pip install aiperf==0.13.0 in a venv)")
    else:
        tokenizer = local_tokenizer(aiperf, tmp / "tokenizer")
        print(f"  AIPerf: {aiperf} (tokenizer {tokenizer}, {args.aiperf_requests} requests)")
    rates: dict[str, list[float]] = {"raw": [], "aiohttp": [], "aiperf": []}
    with MiniServer() as srv:
        for rep in range(args.repeat):
            for name in ("raw", "aiohttp", "aiperf"):
                out = tmp / f"{name}-{rep}"
                if name == "aiperf":
                    if aiperf is None:
                        continue
                    r = run_aiperf(aiperf, data, srv.url, out, requests=args.aiperf_requests,
                                   concurrency=args.concurrency, tokenizer=tokenizer)
                else:
                    ex = run_ours(data, srv.url, out, requests=args.requests,
                                  concurrency=args.concurrency, client=name)
                    assert ex["error_request_count"]["avg"] == 0, ex["error_summary"]
                    r = ex["request_throughput"]["avg"]
                if r is not None:
                    rates[name].append(r)
                    print(f"  rep {rep}: {name:8s} {r:10,.0f} req/s")
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    print("  median req/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()))
    print(f"  raw / aiohttp = {med['raw'] / med['aiohttp']:.2f}x")
    if "aiperf" in med:
        print(f"  raw / AIPerf 0.13.0 = {med['raw'] / med['aiperf']:.2f}x (goal >= 2x)")


def _ttft_line(label: str, client: str, ex: dict) -> None:
    b = ex.get("client_added_ttft") or {}
    errors = ex["error_request_count"]["avg"]
    if not b.get("count"):
        print(f"  {label}, {client}: no server TTFT header ({errors} errors)")
        return
    print(f"  {label:22s} {client:8s} client-added TTFT p50 {b['p50']:.3f} ms, p90 {b['p90']:.3f}"
          f" ms (n={b['count']}, errors={errors}); TTFT p50 {ex['time_to_first_token']['p50']:.2f} ms")


def section_ttft(args, tmp: Path) -> None:
    print(f"== client-added TTFT (client TTFT - x-mmdatagen-server-ttft-ns), streaming, "
          f"concurrency 64; minimal server, first token {args.first_token_ms:g} ms after the "
          f"request arrives (server TTFT = last request byte in -> first byte out)")
    short = _text_dataset(tmp / "short.jsonl", 200)
    big = _image_dataset(tmp / "big.jsonl")
    print(f"  image body size: {big.stat().st_size / 16 / 1e6:.2f} MB per request")
    with MiniServer(delay_ms=args.first_token_ms) as srv:
        for label, path, n, conc in (
                ("short bodies", short, args.ttft_requests, 64),
                ("2.6 MB image bodies", big, max(128, args.ttft_requests // 10), 64),
                ("2.6 MB image bodies", big, 100, 1)):
            for client in ("raw", "aiohttp"):
                ex = run_ours(path, srv.url, tmp / f"ttft-{client}-{n}-{conc}", requests=n,
                              concurrency=conc, client=client, streaming=True,
                              warmup=min(64, n))
                _ttft_line(f"{label} c={conc}", client, ex)
                if path is big:
                    print(f"{'':34s}({ex['request_throughput']['avg']:,.0f} req/s = "
                          f"{ex['request_throughput']['avg'] * 2.6:,.0f} MB/s of request bodies)")
    if args.skip_sim:
        return
    from mmdatagen.settings.sim import Simulator
    from mmdatagen.sim.embedded import EmbeddedServer

    print("== for reference: the simulator (qwen3-vl-30b-gb200 profile, 50 output tokens); its "
          "server TTFT stops when the engine emits the token, so the simulator's own event-loop "
          "queueing before it writes is counted here as 'client-added'")
    with EmbeddedServer(Simulator().with_values({"profile": "qwen3-vl-30b-gb200",
                                                 "cache_size": 10.0})) as srv:
        for client in ("raw", "aiohttp"):
            ex = run_ours(short, srv.url, tmp / f"sim-{client}", requests=1000, concurrency=64,
                          client=client, streaming=True,
                          model="Qwen/Qwen3-VL-30B-A3B-Instruct-FP8", warmup=64)
            _ttft_line("short bodies (sim)", client, ex)


def _collector_run(held: str, data: str, url: str, out: str, requests: str) -> None:
    """One streaming run in this fresh process; ``held`` "0": the block replaced by nothing."""
    import contextlib
    import json

    if held == "0":
        import mmdatagen.loadgen.run as run_module

        run_module.rare_full_collections = contextlib.nullcontext  # type: ignore[assignment]
    ex = run_ours(Path(data), url, Path(out), requests=int(requests), concurrency=16,
                  streaming=True)
    t = ex["time_to_first_token"]
    print(json.dumps({"max": t["max"], "p99": t["p99"], "rate": ex["request_throughput"]["avg"],
                      "errors": ex["error_request_count"]["avg"]}))


def section_gc(args, tmp: Path) -> None:
    import json

    print(f"== cycle collector: streaming short text, concurrency 16, {args.gc_requests} "
          f"requests per run, zero-delay minimal server, {args.repeat + 1} runs each")
    data = _text_dataset(tmp / "gc.jsonl", 2000)
    got: dict[str, list[dict]] = {"1": [], "0": []}
    with MiniServer() as srv:
        for rep in range(args.repeat + 1):
            for held in ("0", "1"):
                res = subprocess.run([sys.executable, __file__, "--collector-run", held,
                                      str(data), srv.url, str(tmp / f"gc-{held}-{rep}"),
                                      str(args.gc_requests)], capture_output=True, text=True,
                                     check=True)
                r = json.loads(res.stdout.strip().splitlines()[-1])
                assert r["errors"] == 0
                got[held].append(r)
                name = "held off" if held == "1" else "as Python"
                print(f"  rep {rep}: full collections {name:9s}: TTFT max {r['max']:7.2f} ms, "
                      f"p99 {r['p99']:6.2f} ms, {r['rate']:8,.0f} req/s")
    med = {k: statistics.median(x["max"] for x in v) for k, v in got.items()}
    print(f"  median TTFT max: held off {med['1']:.2f} ms, as Python {med['0']:.2f} ms: "
          f"{med['0'] / med['1']:.1f}x lower with them held off")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        return serve(int(sys.argv[2]), float(sys.argv[3]))
    if len(sys.argv) == 7 and sys.argv[1] == "--collector-run":
        return _collector_run(*sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--aiperf-requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ttft-requests", type=int, default=3000)
    ap.add_argument("--aiperf", default=None, help="Path to the aiperf executable.")
    ap.add_argument("--skip-rate", action="store_true")
    ap.add_argument("--skip-ttft", action="store_true")
    ap.add_argument("--skip-gc", action="store_true", help="Skip the cycle collector section.")
    ap.add_argument("--gc-requests", type=int, default=40000)
    ap.add_argument("--skip-sim", action="store_true", help="Skip the simulator reference line.")
    ap.add_argument("--first-token-ms", type=float, default=20.0,
                    help="Minimal server's delay to the first token in the TTFT section.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as d:
        tmp = Path(d)
        if not args.skip_rate:
            section_rate(args, tmp)
        if not args.skip_ttft:
            section_ttft(args, tmp)
        if not args.skip_gc:
            section_gc(args, tmp)


if __name__ == "__main__":
    main()
