"""Loader speed: request rate vs AIPerf, raw vs aiohttp client, client-added TTFT.

    python benchmarks/bench_loadgen.py [--requests 20000] [--aiperf PATH] [--repeat 2]

1. Request rate: short non-streaming text requests at concurrency 32 against a zero-delay
   server (a minimal uvloop HTTP/1.1 server in a subprocess, so it outpaces any client on the
   other core). Runs mmdatagen's raw client, its aiohttp client and, when installed, AIPerf
   (``--aiperf``, ``$AIPERF``, ``aiperf`` on PATH or /tmp/aiperf-venv/bin/aiperf; it runs with
   ``--tokenizer builtin`` offline), interleaved, and prints ratios measured in this run.
2. Client-added TTFT (client TTFT - the server's ``x-mmdatagen-server-ttft-ns``) p50 at
   concurrency 64, streaming, against the simulator's zero-delay profile, with short bodies and
   with 2.6 MB image bodies.

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
    sse = _sse_body()

    def connection_made(self, transport) -> None:
        self.t = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = self.buf[:i].lower()
            j = head.find(b"content-length:")
            n = int(head[j + 15:head.find(b"\r\n", j) if head.find(b"\r\n", j) > 0 else None]) if j >= 0 else 0
            if len(self.buf) < i + 4 + n:
                return
            t0 = time.perf_counter_ns()
            body = self.buf[i + 4:i + 4 + n]
            self.buf = self.buf[i + 4 + n:]
            stream = b'"stream":true' in body
            payload = self.sse if stream else _BODY
            ctype = b"text/event-stream" if stream else b"application/json"
            ttft = time.perf_counter_ns() - t0
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype +
                         b"\r\nx-mmdatagen-server-ttft-ns: %d\r\nContent-Length: %d\r\n\r\n"
                         % (ttft, len(payload)) + payload)


def serve(port: int) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
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
    def __enter__(self) -> MiniServer:
        self.port = _free_port()
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port)],
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
    from mmdatagen.loadgen.run import BenchConfig, run_bench

    cfg = BenchConfig(input_file=path, model=model, url=url, concurrency=concurrency,
                      request_count=requests, warmup_request_count=warmup, streaming=streaming,
                      output_dir=out, quiet=True, predict=False, http_client=client,
                      extra_inputs={"max_tokens": 4} if streaming else {})
    return run_bench(cfg).export


def find_aiperf(arg: str | None) -> str | None:
    for cand in (arg, os.environ.get("AIPERF"), shutil.which("aiperf"),
                 "/tmp/aiperf-venv/bin/aiperf"):
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


def section_ttft(args, tmp: Path) -> None:
    from mmdatagen.sim.embedded import EmbeddedServer

    print("== client-added TTFT (client TTFT - x-mmdatagen-server-ttft-ns), streaming, "
          "concurrency 64, simulator zero-delay profile")
    short = _text_dataset(tmp / "short.jsonl", 200)
    big = _image_dataset(tmp / "big.jsonl")
    with EmbeddedServer(profile="zero-delay", cache_gb=10.0) as srv:
        for label, path, n in (("short bodies", short, args.ttft_requests),
                               ("2.6 MB image bodies", big, max(64, args.ttft_requests // 20))):
            for client in ("raw", "aiohttp"):
                ex = run_ours(path, srv.url, tmp / f"ttft-{client}-{n}", requests=n,
                              concurrency=64, client=client, streaming=True,
                              model="Qwen/Qwen3-VL-30B-A3B-Instruct-FP8", warmup=16)
                b = ex.get("client_added_ttft") or {}
                errors = ex["error_request_count"]["avg"]
                if not b.get("count"):
                    print(f"  {label}, {client}: no server TTFT header ({errors} errors)")
                    continue
                print(f"  {label:20s} {client:8s} client-added TTFT p50 {b['p50']:.3f} ms, "
                      f"p90 {b['p90']:.3f} ms (n={b['count']}, errors={errors}); "
                      f"TTFT p50 {ex['time_to_first_token']['p50']:.3f} ms")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        return serve(int(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--aiperf-requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ttft-requests", type=int, default=3000)
    ap.add_argument("--aiperf", default=None, help="Path to the aiperf executable.")
    ap.add_argument("--skip-rate", action="store_true")
    ap.add_argument("--skip-ttft", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as d:
        tmp = Path(d)
        if not args.skip_rate:
            section_rate(args, tmp)
        if not args.skip_ttft:
            section_ttft(args, tmp)


if __name__ == "__main__":
    main()
