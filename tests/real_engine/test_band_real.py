"""The order band against a real vLLM (CPU build, tiny Qwen2-VL) at concurrency 8.

At concurrency 8 the client cannot tell in which order the API server's processor saw requests
whose send-to-first-token windows overlap: bench reports the exact replay in send order with the
band of every order those windows allow (``loadgen/band.py``). Per workload, on the shared server
(fresh seeds, so earlier workloads' images are older than all of this one's):
- the engine's processor-cache hits (``vllm:mm_cache_*`` deltas) lie inside the band, and the
  export says so (``measured_inside``);
- so does the reference model's replay in the order the server logged the requests, and that
  replay equals the engine (the server's order explains the engine);
- the prediction in send order lies inside the band, and the band is narrower than all or
  nothing.
The images of one request fit the 0.005 GiB cache (two 640x480 entries), so vLLM's
processor-cache mirror bug stays out of these runs.
"""
from __future__ import annotations

import shutil

import orjson
import pytest

from .conftest import ARTIFACTS
from .engine import RESULTS, SERVER
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

    export = orjson.loads((out / "profile_export_mmdatagen.json").read_bytes())
    records = [orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()]
    errors = [r["error"] for r in records if r["error"]]
    assert not errors, f"{len(errors)} failed requests, first: {errors[0]}"
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
    RESULTS.append({
        "workload": name, "concurrency": 8, "processor_cache_bytes": int(capacity),
        "references": measured["queries"], "reference_hits": send_order,
        "reference_hits_server_order": server_order, "bench_predicted_hits": pred["hits"],
        "bench_predicted_cache": pred["cache"], "engine_hits": measured["hits"],
        "engine_queries": measured["queries"], "encoder_runs": None,
        "reference_encoder_runs": None, "band_low": band["low"], "band_high": band["high"],
        "band_width": band["width"], "band_method": band["method"],
        "measured_inside": band.get("measured_inside")})
    keep = ARTIFACTS / "band" / name.split(": ", 1)[1].replace(" ", "-").replace(",", "")
    keep.mkdir(parents=True, exist_ok=True)  # for a look at the orders afterwards
    for src in (dataset, out / "records.jsonl", out / "profile_export_mmdatagen.json"):
        shutil.copy(src, keep / src.name)
    for folder in tmp_path.glob("data_*"):  # the dataset's image files
        shutil.copytree(folder, keep / folder.name, dirs_exist_ok=True)
    print(f"\n{name}: engine {measured['hits']}/{measured['queries']}, predicted "
          f"{pred['hits']}, band [{band['low']}, {band['high']}] ({band['method']}), server "
          f"order {server_order}")

    assert export["image_cache"]["server_metrics"]["hits"] == measured["hits"]
    assert pred["references"] == measured["queries"]
    assert band["low"] <= measured["hits"] <= band["high"], band
    assert band["measured_inside"] is True and band["measured"] == measured["hits"]
    assert "inside the band" in proc.stdout
    assert server_order == measured["hits"]  # the server's own order explains the engine
    assert band["low"] <= server_order <= band["high"]
    assert band["low"] <= pred["hits"] == send_order <= band["high"]
    assert band["width"] < measured["queries"], band
