"""The cache prediction against a real vLLM (CPU build, tiny Qwen2-VL) at concurrency 8.

At concurrency 8 the client cannot time the order in which the API server's processor saw
concurrent requests. Per workload, on the shared server (fresh seeds, so earlier workloads'
images are older than all of this one's), two bench runs of one dataset:

1. Plain: the prediction replays the first-token order (the engine serves first come, first
   served) with two bands (``loadgen/band.py``): over the orders first come, first served
   allows (first tokens of one step in either order) and over every order the send and
   first-byte times allow (``any_order``). Checked: the engine's processor-cache hits
   (``vllm:mm_cache_*`` deltas) lie inside both, and the export says so; the reference model
   replayed in the order the server logged the requests equals the engine and lies inside
   both; the point estimate equals the reference replay in first-token order; the
   first-come-first-served band is no wider than the other.
2. ``--reset-cache --server-log <the server's log>``: the order the log names the requests in
   is replayed exactly: width 0, equal to the engine.

The images of one request fit the 0.005 GiB cache (two 640x480 entries), so vLLM's
processor-cache mirror bug stays out of these runs.
"""
from __future__ import annotations

import shutil

import orjson
import pytest

from .conftest import ARTIFACTS
from .engine import RESULTS, SERVER, any_order_band, read_run
from .reference import GIB, processor_hits, requests_in_dispatch_order
from .test_vllm_conformance import cache_target_flags, mmdatagen

pytestmark = pytest.mark.real_engine

WORKLOADS = [
    ("band: pool zipf over 16, 2 images of mixed sizes", "pool",
     ["-n", "64", "--pool-size", "16", "--images-per-request", "2", "--reuse", "zipf",
      "--image-size", "640x480:1,224x224:2", "--seed", "71"]),
    ("band: pool uniform over 40, 2 images of mixed sizes", "pool",
     ["-n", "48", "--pool-size", "40", "--images-per-request", "2", "--reuse", "uniform",
      "--image-size", "640x480:1,224x224:3", "--seed", "73"]),
    ("band: sliding-window sessions in random order", "sliding-window",
     ["--users", "8", "--turns", "6", "--window", "3", "--order", "random",
      "--image-size", "224x224:3,448x336:1", "--image-uuids", "--seed", "72"]),
]


@pytest.mark.parametrize("name,generator,gen_args", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_measured_inside_band(vllm_server, tiny_model, tmp_path, name, generator, gen_args):
    dataset = tmp_path / "data.jsonl"
    mmdatagen(generator, *gen_args, "--text-tokens", "16", "--output-length", "2",
              "--output", dataset, "--quiet", "--force")
    flags = cache_target_flags()
    assert flags, "bench has no --cache option"
    before = vllm_server.mm_cache_counters()
    offset = vllm_server.settled_offset()
    out = tmp_path / "bench"
    proc = mmdatagen("bench", "--input-file", dataset, "--url", vllm_server.url, "--model",
                     tiny_model, "--concurrency", 8, "--output-dir", out, *flags,
                     "--extra-inputs", "ignore_eos:true",
                     "--extra-inputs", "skip_special_tokens:false")
    end = vllm_server.settled_offset()
    after = vllm_server.mm_cache_counters()

    export, records = read_run(out)
    measured = {"hits": int(after["hits"] - before["hits"]),
                "queries": int(after["queries"] - before["queries"])}
    pred = export["image_cache"]["predicted"]
    band = pred["band"]

    dispatched = requests_in_dispatch_order(dataset, records)
    by_xid = dict(dispatched)
    received = vllm_server.received_order(offset, end)
    assert sorted(received) == sorted(by_xid), "server log and bench records disagree"
    capacity = SERVER["processor_cache_gb"] * GIB
    server_order = sum(processor_hits([by_xid[x] for x in received], capacity))
    send_order = sum(processor_hits([items for _, items in dispatched], capacity))
    first_token = {r["metadata"]["x_request_id"]: r["metadata"]["first_token_ns"] for r in records}
    token_order = sum(processor_hits([by_xid[x] for x in sorted(by_xid, key=first_token.get)],
                                     capacity))
    anyb = any_order_band(pred)
    RESULTS.append({
        "workload": name, "concurrency": 8, "processor_cache_bytes": int(capacity),
        "references": measured["queries"], "reference_hits": send_order,
        "reference_hits_server_order": server_order, "bench_predicted_hits": pred["hits"],
        "bench_predicted_cache": pred["cache"], "engine_hits": measured["hits"],
        "engine_queries": measured["queries"], "encoder_runs": None,
        "reference_encoder_runs": None, "band_low": band["low"], "band_high": band["high"],
        "band_width": band["width"], "band_method": band["method"],
        "measured_inside": band.get("measured_inside"), "reference_hits_token_order": token_order,
        "any_order_low": anyb["low"], "any_order_high": anyb["high"],
        "any_order_method": anyb["method"]})
    keep = ARTIFACTS / "band" / name.split(": ", 1)[1].replace(" ", "-").replace(",", "")
    keep.mkdir(parents=True, exist_ok=True)  # for a look at the orders afterwards
    (keep / "received_order.json").write_bytes(orjson.dumps(received))
    for src in (dataset, out / "records.jsonl", out / "profile_export_mmdatagen.json"):
        shutil.copy(src, keep / src.name)
    for folder in tmp_path.glob("data_*"):  # the dataset's image files
        shutil.copytree(folder, keep / folder.name, dirs_exist_ok=True)
    print(f"\n{name}: engine {measured['hits']}/{measured['queries']}, predicted "
          f"{pred['hits']} (first-token order {token_order}, send order {send_order}), band "
          f"[{band['low']}, {band['high']}] ({band['method']}), any order [{anyb['low']}, "
          f"{anyb['high']}] ({anyb['method']}), server order {server_order}")

    assert export["image_cache"]["server_metrics"]["hits"] == measured["hits"]
    assert pred["references"] == measured["queries"]
    assert band["low"] <= measured["hits"] <= band["high"], band
    assert band["measured_inside"] is True and band["measured"] == measured["hits"]
    assert "inside the band" in proc.stdout
    assert server_order == measured["hits"]  # the server's own order explains the engine
    assert band["low"] <= server_order <= band["high"]
    # the point estimate: the replay in first-token order (first come, first served)
    assert band["low"] <= pred["hits"] == token_order <= band["high"]
    # the band over any scheduler's order holds them all, and is wider
    assert anyb["measured_inside"] is True, anyb
    assert anyb["low"] <= min(band["low"], send_order) <= max(band["high"], send_order) \
        <= anyb["high"], (band, anyb)
    assert anyb["width"] < measured["queries"], anyb
    assert band["width"] <= anyb["width"], (band, anyb)

    # the server's log gives the order: exact (a second run from a reset cache)
    logged = bench_counted(vllm_server, tiny_model, dataset, tmp_path / "logged", flags,
                           "--reset-cache", "--server-log", vllm_server.log_path)
    lpred = logged["export"]["image_cache"]["predicted"]
    RESULTS[-1].update(log_order_hits=lpred["hits"], log_order_engine_hits=logged["hits"])
    print(f"  with --server-log: predicted {lpred['hits']}, engine {logged['hits']}, band width "
          f"{lpred['band']['width']}")
    assert lpred["order"] == "the server's log order (exact)", lpred
    assert lpred["band"]["width"] == 0 and "note" not in lpred, lpred
    assert (lpred["hits"], lpred["references"]) == (logged["hits"], logged["queries"]), lpred


def bench_counted(server, tiny_model, dataset, out, flags, *extra) -> dict:
    """One bench run at concurrency 8 with the engine's processor-cache counter deltas."""
    before = server.mm_cache_counters()
    mmdatagen("bench", "--input-file", dataset, "--url", server.url, "--model", tiny_model,
              "--concurrency", 8, "--output-dir", out, *flags, *extra,
              "--extra-inputs", "ignore_eos:true", "--extra-inputs", "skip_special_tokens:false")
    server.settled_offset()
    after = server.mm_cache_counters()
    return {"export": orjson.loads((out / "profile_export_mmdatagen.json").read_bytes()),
            "hits": int(after["hits"] - before["hits"]),
            "queries": int(after["queries"] - before["queries"])}
