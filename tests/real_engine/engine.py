"""A real vLLM (CPU build) server for the conformance suite: start, observe, stop.

The server runs from the engine virtualenv (``setup_engine.py``) as a subprocess on loopback, in its
own session (process group). It is killed as a group when the suite ends and, through a watchdog
process, also when the test process dies without cleaning up.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent

# One server for every workload: a processor cache small enough to evict 640x480 entries
# (0.005 GiB holds two of them) and tiny video clips (four of 1.3 MB), prefix caching off so the
# encoder cache shows, and a 2,048-token batch. Up to 2 videos per prompt: vLLM then sizes its
# encoder cache for its largest video (3,840 tokens at a 4,096-token context), not 2,048.
SERVER = {"processor_cache_gb": 0.005, "max_num_batched_tokens": 2048, "max_images": 6,
          "max_videos": 2, "max_model_len": 4096}
# vLLM's CPU worker runs pinned to one core (auto: core 0, core 1 left to the API server and the
# engine core), and pinned from its imports on: four servers starting together queued their
# workers' imports on core 0 (75 s where one took 16 s). Servers whose timing no test measures
# (the connector's, Dynamo's worker) are pinned to core 1 instead; the shared server keeps auto.
OTHER_CORE = {"VLLM_CPU_OMP_THREADS_BIND": "1"}
TIMINGS: dict[str, float] = {}
RESULTS: list[dict] = []  # one row per workload, printed at the end of the session
CALIBRATION: list[dict] = []  # one row per held-out case of test_calibrate_real

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_HOST_IP": "127.0.0.1",  # else the engine's internal queue binds a non-loopback address
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_mm_cache, /reset_encoder_cache
}

# "Engine 000: Iteration(12): ... KV cache usage: 0.1%, encoder inputs: 2, encoder output
# embeddings: 782" (vllm/v1/metrics/loggers.py, --enable-logging-iteration-details)
ITERATION_LINE = re.compile(r"Iteration\((\d+)\):.*?(?:encoder inputs: (\d+), "
                            r"encoder output embeddings: (\d+))?\s*$")
RECEIVED_LINE = re.compile(r"Received request chatcmpl-(\S+?):")
BUDGET_LINE = re.compile(r"Encoder cache will be initialized with a budget of (\d+) tokens")


def read_run(out: Path) -> tuple[dict, list[dict]]:
    """A bench run folder's export and records, after checking no request failed."""
    import orjson

    export = orjson.loads((out / "profile_export_mmdatagen.json").read_bytes())
    records = [orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()]
    errors = [r["error"] for r in records if r["error"]]
    assert not errors, f"{len(errors)} failed requests, first: {errors[0]}"
    return export, records


class EngineError(RuntimeError):
    """The engine could not be set up, started or queried (the suite fails, never skips)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pdeathsig() -> None:
    """In the child before exec: new session, and SIGKILL when the parent (pytest) dies."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


_WATCHDOG = r"""
import os, signal, sys, time
parent, pgid = int(sys.argv[1]), int(sys.argv[2])
while True:
    time.sleep(1.0)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        sys.exit(0)
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sys.exit(0)
"""


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def launch(cmd: list[str], env: dict[str, str], log_path: Path
           ) -> tuple[subprocess.Popen, subprocess.Popen]:
    """Start ``cmd`` in its own session (process group) with stdout and stderr in ``log_path``
    (its first line the command), and a watchdog that kills the group if this process dies."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                preexec_fn=_pdeathsig)
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(proc.pid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    return proc, watchdog


def group_shared_memory(pgid: int) -> set[str]:
    """Names of the multiprocessing shared-memory segments (``/dev/shm/psm_*``) the processes of
    group ``pgid`` have mapped."""
    names: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            with open(f"/proc/{entry}/maps") as fh:
                for line in fh:
                    _, sep, rest = line.partition("/dev/shm/")
                    if sep and rest.startswith("psm_"):
                        names.add(rest.split()[0])
        except (OSError, ValueError):
            continue
    return names


def stop_group(proc: subprocess.Popen | None, watchdog: subprocess.Popen | None,
               signals: tuple[tuple[int, float], ...] = ((signal.SIGTERM, 20.0),
                                                         (signal.SIGKILL, 10.0))) -> None:
    """SIGTERM the process group, SIGKILL it when it lingers (children may outlive the leader;
    ``signals``: each signal and how long to wait for it), then end the watchdog.
    Shared-memory segments the group had mapped and left behind (vLLM force-kills its engine
    core, which then cannot unlink its message queues) are removed."""
    segments = group_shared_memory(proc.pid) if proc is not None and proc.poll() is None else set()
    if proc is not None and proc.poll() is None:
        for sig, wait in signals:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    if proc is not None:
        try:  # children (engine core) may outlive the API server's exit
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if watchdog is not None and watchdog.poll() is None:
        watchdog.kill()
        watchdog.wait()
    for name in segments:
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass


class ServerLog:
    """What a vLLM process's log file tells: encoder runs, request order, the encoder budget."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = Path(log_path)

    def log_offset(self) -> int:
        return self.log_path.stat().st_size

    def log_text(self, start: int = 0, end: int | None = None) -> str:
        with open(self.log_path, "rb") as fh:
            fh.seek(start)
            data = fh.read() if end is None else fh.read(max(0, end - start))
        return data.decode(errors="replace")

    def encoder_runs(self, start: int, end: int | None = None) -> dict[str, int]:
        """Encoder inputs and iterations logged between two log offsets."""
        runs = tokens = iterations = 0
        for line in self.log_text(start, end).splitlines():
            m = ITERATION_LINE.search(line)
            if m is None:
                continue
            iterations += 1
            if m.group(2):
                runs += int(m.group(2))
                tokens += int(m.group(3))
        return {"encoder_inputs": runs, "encoder_output_embeddings": tokens,
                "iterations": iterations}

    def received_order(self, start: int, end: int | None = None) -> list[str]:
        """Client X-Request-IDs in the order the server finished processing their inputs."""
        return RECEIVED_LINE.findall(self.log_text(start, end))

    def settled_offset(self, quiet: float = 1.0, timeout: float = 15.0) -> int:
        """The log size once it stopped growing for ``quiet`` seconds (late stat lines land)."""
        deadline = time.monotonic() + timeout
        size = self.log_offset()
        still_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = self.log_offset()
            if now != size:
                size, still_since = now, time.monotonic()
            elif time.monotonic() - still_since >= quiet:
                break
        return size

    def logged_encoder_budget(self) -> int | None:
        """The encoder cache budget from the startup log; None when not logged (vLLM logs it
        from the profiling run, which the CPU worker skips in eager mode)."""
        m = BUDGET_LINE.search(self.log_text())
        return int(m.group(1)) if m else None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"


class VllmServer(ServerLog):
    """One ``vllm.entrypoints.openai.api_server`` process group with its log in a file."""

    def __init__(self, python: Path, model: Path, log_path: Path, *, processor_cache_gb: float,
                 max_num_batched_tokens: int, max_images: int, max_videos: int = 0,
                 prefix_caching: bool = False,
                 max_model_len: int = 4096, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, start_timeout: float = 400.0) -> None:
        self.python = Path(python)
        self.model = Path(model)
        self.processor_cache_gb = processor_cache_gb
        super().__init__(log_path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            "--model", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(max_model_len), "--dtype", "bfloat16",
            "--mm-processor-cache-gb", repr(processor_cache_gb),
            "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
            "--limit-mm-per-prompt", json.dumps({"image": max_images, "video": max_videos}),
            "--max-num-batched-tokens", str(max_num_batched_tokens),
            "--enable-logging-iteration-details",
            # "Received request chatcmpl-<X-Request-ID>" once a request's inputs are processed:
            # the order in which the processor cache saw the requests
            "--enable-log-requests",
            # eager: torch.compile of even this tiny model costs 15-100 s per cold start
            "--compilation-config", json.dumps({"mode": 0}), *(extra_args or []),
        ]
        self.env = dict(env or {})  # the server's environment beyond OFFLINE_ENV
        self.proc: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None
        self.start_seconds: float | None = None
        self._started, self._timeout = 0.0, start_timeout

    # -- lifecycle ---------------------------------------------------------------------------
    def begin(self, timeout: float | None = None) -> None:
        """Launch the server (``step`` tells when it answers): several servers start together
        this way (``servers.start_all``), each start being mostly imports, one process after
        another (about one core)."""
        env = dict(os.environ)
        env.update(OFFLINE_ENV)
        env.update(self.env)
        self._started = time.monotonic()
        self._timeout = self._timeout if timeout is None else timeout
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", *self.args]
        self.proc, self.watchdog = launch(cmd, env, self.log_path)

    def step(self) -> bool:
        """True once the server answers; raises EngineError (after stopping it) when it exited
        or did not answer within the timeout."""
        assert self.proc is not None, "begin() first"
        if self.proc.poll() is not None:
            raise EngineError(f"vLLM exited with status {self.proc.returncode} while "
                              f"starting; log {self.log_path}:\n{self.tail()}")
        if self._health():
            self.start_seconds = time.monotonic() - self._started
            return True
        if time.monotonic() - self._started > self._timeout:
            self.stop()
            raise EngineError(f"vLLM did not answer /health within {self._timeout:.0f} s; log "
                              f"{self.log_path}:\n{self.tail()}")
        return False

    def stop(self) -> None:
        stop_group(self.proc, self.watchdog)

    # -- observation -------------------------------------------------------------------------
    def _get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        return http_get(self.url + path, timeout)

    def _health(self) -> bool:
        return self._get("/health", timeout=2.0)[0] == 200

    def post(self, path: str) -> int:
        req = urllib.request.Request(self.url + path, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status

    def mm_cache_counters(self) -> dict[str, float]:
        """``vllm:mm_cache_queries_total`` and ``vllm:mm_cache_hits_total`` summed over labels."""
        status, text = self._get("/metrics")
        if status != 200:
            raise EngineError(f"GET /metrics answered {status}")
        out = {"queries": 0.0, "hits": 0.0}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name == "vllm:mm_cache_queries_total":
                out["queries"] += float(line.rsplit(" ", 1)[1])
            elif name == "vllm:mm_cache_hits_total":
                out["hits"] += float(line.rsplit(" ", 1)[1])
        return out


def prediction_band(pred: dict) -> dict | None:
    """The export's order band (``predicted.band``): the lowest and highest hits over every
    order in which the server may have seen the requests. Server counters cover every request
    of the run, so the band over all requests when the export has it; None without a band."""
    band = pred.get("band")
    if not isinstance(band, dict) or "low" not in band or "high" not in band:
        return None
    whole = band.get("all_requests") or band
    return {"low": whole["low"], "high": whole["high"], "method": band.get("method"),
            "measured_inside": band.get("measured_inside")}


def any_order_band(pred: dict) -> dict:
    """The export's band over every order the send and first-byte times allow, whatever the
    scheduler. Beside a first-come-first-served band it is ``band.any_order``; where the
    first-come search gave up (or had no first tokens, or no two windows overlap) the reported
    band is itself that band. Not for a band ordered by the server's log."""
    band = pred["band"]
    assert not str(band.get("order", "")).startswith("the server's log order"), band
    return band.get("any_order", band)
