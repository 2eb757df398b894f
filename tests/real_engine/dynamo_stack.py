"""NVIDIA Dynamo's whole stack on the CPU engine, for the real-engine suite: an aggregated vLLM
worker (``python -m dynamo.vllm`` with the multimodal embedding cache) behind Dynamo's HTTP
frontend (``python -m dynamo.frontend``), on loopback, without etcd or NATS.

- Discovery through files (``--discovery-backend file``, a fresh ``DYN_FILE_KV`` folder per
  stack: a dead worker's registration would make the frontend route to it), requests over TCP,
  events over ZMQ; every host Dynamo binds or advertises set to 127.0.0.1, and the logs checked
  for any other address.
- ZMQ in broker mode (``DYN_ZMQ_BROKER_URL``): in its default direct mode each event publisher
  binds ``tcp://0.0.0.0:0`` (every interface; no setting changes that). A small XSUB/XPUB relay
  (pyzmq, :data:`BROKER`) bound to 127.0.0.1 runs as a third process instead, and the publishers
  connect to it.
- The worker's system port (``DYN_SYSTEM_PORT``; below 32768: Dynamo reads it as an i16) serves
  its ``/metrics``, Dynamo's ``dynamo_component_embedding_cache_*`` counters among them
  (``PROMETHEUS_MULTIPROC_DIR`` is an empty folder of the stack's own).
- ``dynamo_stack_hook/sitecustomize.py`` first on ``PYTHONPATH``: the connector keeps embeddings
  on the CPU (it would move them to CUDA).
- Compilation ``{"mode": 2, "backend": "eager"}`` (trace once, no inductor): vLLM's CPU worker
  skips its profiling run in eager mode (mode 0), and that run is what logs the encoder-cache
  budget ("Encoder cache will be initialized with a budget of N tokens").
- The broker, then the worker (ready once it registered its ``generate`` endpoint and its system
  port answers ``/health``), then the frontend (ready when ``/v1/models`` lists the model). Each
  runs in its own process group (``engine.launch``) and is killed as a group on ``stop``.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .engine import OFFLINE_ENV, EngineError, ServerLog, free_port, http_get, launch, stop_group

HERE = Path(__file__).resolve().parent
HOOK = HERE / "dynamo_stack_hook"
# every address Dynamo binds or advertises (by default the worker advertises a non-loopback one)
LOOPBACK_HOSTS = ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_EVENT_PLANE_HOST",
                  "DYN_HTTP_HOST", "DYN_SYSTEM_HOST", "DYN_HTTP_RPC_HOST")
TRANSPORT = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
METRICS = {"hits": "dynamo_component_embedding_cache_hits_total",
           "misses": "dynamo_component_embedding_cache_misses_total",
           "evictions": "dynamo_component_embedding_cache_evictions_total",
           "entries": "dynamo_component_embedding_cache_entries"}  # a gauge
# XSUB/XPUB relay for Dynamo's ZMQ event plane, on loopback: python -c BROKER XSUB_PORT XPUB_PORT
BROKER = r"""
import sys, zmq
ctx = zmq.Context()
xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
xsub.bind("tcp://127.0.0.1:" + sys.argv[1])
xpub.bind("tcp://127.0.0.1:" + sys.argv[2])
print("broker: xsub tcp://127.0.0.1:%s xpub tcp://127.0.0.1:%s" % tuple(sys.argv[1:3]), flush=True)
zmq.proxy(xsub, xpub)
"""
BROKER_READY = re.compile(r"^broker: xsub tcp://127\.0\.0\.1:\d+ ", re.M)
IPV4 = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")
# hosts the logs name as endpoints: tcp:// and http:// URLs, host=/addr=/address=/ip= fields
ENDPOINT_HOST = re.compile(r"(?:\b(?:tcp|http)://|\b(?:host|addr|address|ip)=\"?)"
                           r"(\[[^\]]*\]|[^\s:/\"',)]+)")
# the one address a log may print
NOT_ENDPOINTS = {"127.0.0.1"}


def free_i16_port() -> int:
    """A free loopback port below 32768: Dynamo's runtime reads DYN_SYSTEM_PORT as an i16."""
    for _ in range(200):
        port = random.randint(20000, 32767)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise EngineError("no free loopback port below 32768")


class DynamoStack:
    """One worker and one frontend, their logs in ``log_dir``."""

    def __init__(self, python: Path, model: Path, log_dir: Path, *, capacity_gb: float,
                 max_num_batched_tokens: int, max_images: int, max_model_len: int = 4096,
                 env: dict[str, str] | None = None) -> None:
        self.python = Path(python)
        self.extra_env = dict(env or {})  # the processes' environment beyond the stack's own
        self.model = Path(model)
        self.capacity_gb = capacity_gb
        self.worker = ServerLog(Path(log_dir) / "dynamo-worker.log")
        self.frontend = ServerLog(Path(log_dir) / "dynamo-frontend.log")
        self.broker = ServerLog(Path(log_dir) / "dynamo-zmq-broker.log")
        self.http_port, self.system_port = free_port(), free_i16_port()
        self.broker_ports = (free_port(), free_port())
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.metrics_url = f"http://127.0.0.1:{self.system_port}"
        self.worker_args = [
            "--model", str(self.model), "--enable-multimodal",
            "--multimodal-embedding-cache-capacity-gb", repr(capacity_gb), *TRANSPORT,
            "--max-model-len", str(max_model_len), "--dtype", "bfloat16",
            "--no-enable-prefix-caching",
            "--limit-mm-per-prompt", json.dumps({"image": max_images, "video": 0}),
            "--max-num-batched-tokens", str(max_num_batched_tokens),
            "--enable-logging-iteration-details",
            # trace once, eager backend: the profiling run (which logs the encoder budget) runs,
            # without inductor (its compilation costs 15-100 s per cold start)
            "--compilation-config", json.dumps({"mode": 2, "backend": "eager"}),
        ]
        self.frontend_args = ["--http-host", "127.0.0.1", "--http-port", str(self.http_port),
                              *TRANSPORT]
        # (name, process, its watchdog, its log), in start order
        self._procs: list[tuple[str, subprocess.Popen, subprocess.Popen, ServerLog]] = []
        self._state: str | None = None  # the stack's own folder (discovery, Prometheus files)
        self._stages: list[tuple] = []
        self._stage_started = 0.0
        self.start_seconds: dict[str, float] = {}

    def _env(self) -> dict[str, str]:
        assert self._state is not None
        env = {**os.environ, **OFFLINE_ENV, **self.extra_env,
               **{k: "127.0.0.1" for k in LOOPBACK_HOSTS}}
        env.update(DYN_FILE_KV=os.path.join(self._state, "kv"),
                   PROMETHEUS_MULTIPROC_DIR=os.path.join(self._state, "prometheus"),
                   DYN_SYSTEM_PORT=str(self.system_port),  # (DYN_SYSTEM_ENABLED: deprecated)
                   DYN_ZMQ_BROKER_URL="xsub=tcp://127.0.0.1:{} , xpub=tcp://127.0.0.1:{}".format(
                       *self.broker_ports),
                   PYTHONPATH=os.pathsep.join(
                       p for p in (str(HOOK), os.environ.get("PYTHONPATH")) if p))
        return env

    # -- lifecycle ---------------------------------------------------------------------------
    def begin(self, timeout: float = 400.0) -> None:
        """Launch the broker; ``step`` launches the worker once the broker is ready, then the
        frontend once the worker is (several servers start together this way)."""
        self._state = tempfile.mkdtemp(prefix="mmdatagen-dynamo-")
        for sub in ("kv", "prometheus"):
            os.mkdir(os.path.join(self._state, sub))
        env = self._env()
        front_env = {k: v for k, v in env.items() if k != "DYN_SYSTEM_PORT"}
        # (name, command, environment, log, ready, timeout), in start order
        self._stages = [
            ("ZMQ broker", [str(self.python), "-c", BROKER, *map(str, self.broker_ports)],
             env, self.broker, self._broker_ready, 60.0),
            ("worker", [str(self.python), "-m", "dynamo.vllm", *self.worker_args],
             env, self.worker, self._worker_ready, timeout),
            ("frontend", [str(self.python), "-m", "dynamo.frontend", *self.frontend_args],
             front_env, self.frontend, self._lists_model, timeout)]
        self._launch_next()

    def _launch_next(self) -> None:
        name, cmd, env, log, _, _ = self._stages[len(self._procs)]
        self._stage_started = time.monotonic()
        proc, watchdog = launch(cmd, env, log.log_path)
        self._procs.append((name, proc, watchdog, log))

    def step(self) -> bool:
        """True once the frontend lists the model; raises EngineError (after stopping what
        started) when a process exited or a stage was not ready within its timeout."""
        try:
            name, _, _, log, ready, timeout = self._stages[len(self._procs) - 1]
            if not ready():
                for other, oproc, _, olog in self._procs:
                    if oproc.poll() is not None:
                        raise EngineError(f"Dynamo's {other} exited with status "
                                          f"{oproc.returncode} while the {name} started; log "
                                          f"{olog.log_path}:\n{olog.tail()}")
                if time.monotonic() - self._stage_started > timeout:
                    raise EngineError(f"Dynamo's {name} was not ready within {timeout:.0f} s; "
                                      f"log {log.log_path}:\n{log.tail()}")
                return False
            self.start_seconds[name] = time.monotonic() - self._stage_started
            if len(self._procs) == len(self._stages):
                return True
            self._launch_next()
            return False
        except BaseException:
            self.stop()
            raise

    def _broker_ready(self) -> bool:
        return BROKER_READY.search(self.broker.log_text()) is not None

    def _worker_ready(self) -> bool:
        """Registered (its generate endpoint in the discovery folder), then healthy: /health is
        not polled before, as each refusal is an error line in the worker's log."""
        assert self._state is not None
        instances = Path(self._state, "kv", "v1", "instances")
        if not instances.is_dir() or not any("generate" in f.name for f in instances.iterdir()):
            return False
        return http_get(self.metrics_url + "/health", 2.0)[0] == 200

    def _lists_model(self) -> bool:
        status, body = http_get(self.url + "/v1/models", 2.0)
        if status != 200:
            return False
        try:
            ids = [m.get("id") for m in json.loads(body).get("data") or []]
        except (ValueError, AttributeError):
            return False
        return str(self.model) in ids

    def stop(self) -> None:
        """Frontend, worker, broker (each as a process group); then the stack's folder goes."""
        for _, proc, watchdog, _ in reversed(self._procs):
            stop_group(proc, watchdog)
        self._procs.clear()
        if self._state is not None:
            shutil.rmtree(self._state, ignore_errors=True)
            self._state = None

    def alive(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for _, p, _, _ in self._procs)

    # -- observation -------------------------------------------------------------------------
    def embedding_counters(self) -> dict[str, int]:
        """Dynamo's embedding-cache counters (and its entries gauge) at the worker's system port,
        summed over labels (absent before their first increment: 0)."""
        status, text = http_get(self.metrics_url + "/metrics")
        if status != 200:
            raise EngineError(f"GET {self.metrics_url}/metrics answered {status}")
        out = dict.fromkeys(METRICS, 0.0)
        names = {v: k for k, v in METRICS.items()}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            key = names.get(line.split("{", 1)[0].split(" ", 1)[0])
            if key is not None:
                out[key] += float(line.rsplit(" ", 1)[1])
        return {k: int(v) for k, v in out.items()}

    def encoder_budget(self) -> int:
        """vLLM's encoder-cache budget in tokens, as the worker logged it at startup."""
        budget = self.worker.logged_encoder_budget()
        if budget is None:
            raise EngineError("the worker's log has no 'Encoder cache will be initialized with "
                              f"a budget of N tokens' line: {self.worker.log_path}")
        return budget

    def foreign_addresses(self) -> dict[str, list[str]]:
        """Addresses other than 127.0.0.1 in each log: any IPv4 address (a wildcard bind
        included) and any other host an endpoint URL or a host/address field names."""
        out = {}
        for log in (self.broker, self.worker, self.frontend):
            text = log.log_text()
            seen = sorted((set(IPV4.findall(text)) | set(ENDPOINT_HOST.findall(text)))
                          - NOT_ENDPOINTS)
            if seen:
                out[log.log_path.name] = seen
        return out
