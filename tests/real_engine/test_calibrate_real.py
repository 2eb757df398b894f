"""``mmdatagen calibrate`` against a real vLLM (CPU build, tiny Qwen2-VL): fit a profile on
short runs at concurrency 1 and 2, then predict held-out runs (other datasets, other image
sizes and prompts, concurrency 4 and 8, another processor-cache size on a second server) in
virtual time and compare TTFT p50 and request throughput with the engine's.

The calibration runs (fresh seeds on the shared server, so their images are new to it):
- ``reuse``: one 448x336 image from a pool of 8, so the processor cache and vLLM's encoder
  cache hit (what a hit saves);
- ``two``: two images of two sizes and no reuse, the caches on but never hit (the
  cache-off baseline, and the encoder's cost per image against per image token); again at
  concurrency 2 (a decode step's cost per running request);
- ``long``: 600 words of text, about 3,100 tokens (attention's part that grows with the
  prompt; the prompt is chunked at the server's 2,048-token budget).

The step costs are fitted to the server's own step times (its log's step lines: the server
runs with ``--enable-logging-iteration-details``; the calibration runs' lines only: not the
warm-up's, a fresh server's slower steps, nor the held-out runs' own), except a step's
constant (the log does not time the engine's work between steps: ``calibrate.CADENCE``); the
frontend's costs are fitted to the runs' records and frontend stages (the decode context's
stays at the base's 0: the log's decode steps carry it). Fitted from the records alone, a
decode step's cost per running request came out 3.1 ms where the log shows 0.35, and
throughput at concurrency 8 was over-predicted by up to 44 %.

The base profile is the server as started: its model folder, token budget, context and encoder
cache (``encoder_cache`` beside the processor cache, budget as logged or vLLM's rule).

Each held-out case runs ``REPEATS`` times on one dataset (``--reset-cache`` between: vLLM's
dev-mode resets of its processor, encoder and prefix caches), and the prediction is compared
with the repeats' mean; their spread (max - min over mean) is reported beside the error. The
goal is within 15 %; the assertion is ``TOLERANCE`` plus the spread beyond the prediction's
band from the fit's uncertainty, as stated in the README.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from . import servers, setup_engine
from .conftest import ARTIFACTS
from .engine import CALIBRATION, SERVER, VllmServer, read_run
from .test_vllm_conformance import mmdatagen, server_encoder_budget

pytestmark = pytest.mark.real_engine

# per case and metric: the measured mean (of REPEATS runs) within TOLERANCE of the prediction's
# band, widened by the repeats' spread. The band is the prediction ± BAND sigma of the fit's own
# uncertainty (``calibrate.predict_interval``: the run replayed at the sigma points of the fitted
# costs' covariance, as ``simulate``'s what-if intervals), so a fit that cannot tell two costs
# apart (the frontend's per request against per preprocessed image: correlation -0.89, se 9 and
# 7 ms) predicts the range those costs allow, not one arbitrary split. The goal is 15 %, not met.
# - Throughput: fitted from records alone it came out 16-44 % high at concurrency 4 and 8
#   (two of three CI runs failed 0.30); with the step costs from the engine's log, -9 to +23 %
#   over 32 held-out cases in eight runs. 0.30 guards that.
# - TTFT p50: -41 to +62 % from the band's centre over 32 cases in eight runs. At concurrency 4
#   and 8 the first tokens depend on a race of tens of ms (whether the next requests reach the
#   engine before a wave's last decode steps are done), in the model and in the engine. Without
#   the zipf pool at concurrency 8 (REPORTED_ONLY), -41 to +17 % over 15 cases in five runs;
#   0.45 beyond the band guards that, and the fitted costs with the frontend's set to 0 (-38 to
#   -55 % on those cases in one run) fail it.
# - On a host 1.65x faster (2026-11-28), four runs: TTFT p50 -23 to +39 %, throughput -8 to
#   +34 %, 23 of 32 within 15 %; one server start ran the zipf pool at concurrency 4 25 %
#   slower than the others while the fits predicted alike (README, analyst section).
TOLERANCE = {"throughput": 0.30, "ttft_p50": 0.45}
BAND = 2.0  # sigmas: about 95 % if the fitted costs' errors are normal
# Reported, not asserted: the zipf pool's TTFT p50 at concurrency 8, which the engine does not
# repeat. Six server starts, the same command, two repeats each: 711/714, 693/654, 913/769,
# 908/827, 1056/978 and 759/1139 ms; one start's repeats mostly agree more closely than the
# starts do, so their spread does not cover it. The model, deterministic, predicts one value
# from the fitted frontend: 669 ms (18 ms per preprocessed image) to 1076-1093 ms (36 ms per
# request). Why the engine moves between starts is not known (a guess: eight prompts of about
# 2,100 tokens, over the 2,048-token budget, either queue for their chunks together or drift
# apart, the prefills beside other requests' decodes).
REPORTED_ONLY = {("pool zipf 320x240", 8, "ttft_p50")}
REPEATS = 2
# name, generator args, concurrency (calibration). ``two-c2`` at concurrency 3 instead was tried
# (2026-12-02, two server starts): the log's per_seq_ms came out 0.55 +- 0.09 and 0.0 +- 0.09
# ms, where every step of the same servers (held-out runs included) gives 0.41-0.74. On this
# CPU build a step slows while the API server preprocesses another request's images beside it
# (decode steps of 1 request: 5.2-10.8 ms in runs at concurrency 2, 3.6-5.0 ms at 1), and a
# run at 2 or 3 has its fewer-request steps exactly then, so it reads as a smaller cost per
# request. The model has no such contention term (the frontend and the steps overlap freely).
FIT = [
    ("reuse", ["pool", "-n", "24", "--pool-size", "8", "--image-size", "448x336",
               "--text-tokens", "200", "--seed", "301"], 1),
    ("two", ["pool", "-n", "24", "--pool-size", "48", "--images-per-request", "2",
             "--image-size", "224x224:1,448x336:1", "--text-tokens", "100", "--seed", "302"], 1),
    ("two-c2", ["pool", "-n", "24", "--pool-size", "48", "--images-per-request", "2",
                "--image-size", "224x224:1,448x336:1", "--text-tokens", "100",
                "--seed", "303"], 2),
    ("long", ["pool", "-n", "16", "--pool-size", "16", "--image-size", "448x336",
              "--text-tokens", "600", "--seed", "304"], 1),
]
WARM = ["pool", "-n", "24", "--pool-size", "24", "--images-per-request", "2",
        "--image-size", "224x224:1,448x336:1,640x480:1", "--text-tokens", "300", "--seed", "300"]
HELD_OUT = [
    ("sessions 224x224 + 640x480", ["sliding-window", "--users", "6", "--turns", "4",
                                    "--window", "3", "--image-size", "224x224:1,640x480:1",
                                    "--text-tokens", "300", "--seed", "311"], 4),
    ("sessions 224x224 + 640x480", ["sliding-window", "--users", "8", "--turns", "3",
                                    "--window", "3", "--image-size", "224x224:1,640x480:1",
                                    "--text-tokens", "300", "--seed", "312"], 8),
    ("pool zipf 320x240", ["pool", "-n", "24", "--pool-size", "12", "--reuse", "zipf",
                           "--image-size", "320x240", "--text-tokens", "400",
                           "--seed", "313"], 4),
    ("pool zipf 320x240", ["pool", "-n", "24", "--pool-size", "12", "--reuse", "zipf",
                           "--image-size", "320x240", "--text-tokens", "400",
                           "--seed", "314"], 8),
]


# Another cache size, held out: the zipf pool at concurrency 4 again (the same dataset), on a
# second server that is the first with its processor cache off (0 GiB: every image preprocessed;
# at 0.005 GiB 15 of its 24 images hit). A second server is a second start: its spread from the
# first is in what it measures.
OTHER_SIZE = ("pool zipf 320x240", 4, 0.0)


def _other_size_server(python: Path, model: Path) -> VllmServer:
    return VllmServer(python, model, ARTIFACTS / "vllm-other-cache-size.log",
                      **{**SERVER, "processor_cache_gb": OTHER_SIZE[2]})


servers.register("other_size_server", setup_engine.ensure, _other_size_server)


@pytest.fixture(scope="session")
def other_size_server(started: servers.Started) -> VllmServer:
    return started.get("other_size_server")


def bench(server, model: Path, dataset: Path, concurrency: int, out: Path,
          reset: bool = False) -> Path:
    mmdatagen("bench", "--input-file", dataset, "--url", server.url, "--model", model,
              "--concurrency", concurrency, "--output-dir", out, "--quiet",
              "--cache", "vllm-processor", "--cache-size", repr(server.processor_cache_gb),
              "--warmup-request-count", 2, *(["--reset-cache"] if reset else []),
              "--extra-inputs", "ignore_eos:true", "--extra-inputs", "skip_special_tokens:false")
    read_run(out)
    return out


def headline(run: Path) -> dict[str, float]:
    export, _ = read_run(run)
    return {"ttft_p50": export["time_to_first_token"]["p50"],
            "throughput": export["request_throughput"]["avg"]}


def dataset(tmp: Path, name: str, args: list[str]) -> Path:
    path = tmp / f"{name.replace(' ', '_')}.jsonl"
    mmdatagen(*args, "--output-length", "16", "--output", path, "--quiet", "--force")
    return path


def test_calibrated_profile_predicts_held_out_runs(vllm_server, other_size_server, tiny_model,
                                                   tmp_path):
    base = tmp_path / "cpu-vllm-base.yaml"
    base.write_text(yaml.safe_dump({
        "name": "cpu-vllm-base", "description": "the suite's vLLM server as started",
        "model": str(tiny_model), "cache": "vllm-processor",
        "token_budget": SERVER["max_num_batched_tokens"],
        "max_model_len": SERVER["max_model_len"], "natural_output_tokens": 16,
        "encoder_cache": True, "encoder_budget": server_encoder_budget(vllm_server)}))
    # a fresh CPU server answers its first few dozen requests up to 2x slower (measured: 220
    # against 122 ms for the same prompt): warm it before anything is measured
    bench(vllm_server, tiny_model, dataset(tmp_path, "warm", WARM), 2, tmp_path / "warm")
    warmed = Path(vllm_server.log_path).stat().st_size
    fit_runs = [bench(vllm_server, tiny_model, dataset(tmp_path, name, args), conc,
                      tmp_path / f"fit-{name}") for name, args, conc in FIT]
    # the server's step lines of the calibration runs: not the warm-up's (a fresh server's
    # steps, its first one up to 282 ms), and not the held-out runs' own
    fit_log = tmp_path / "vllm-calibration-runs.log"
    fit_log.write_bytes(Path(vllm_server.log_path).read_bytes()[warmed:])
    held: list[tuple[str, int, list[Path]]] = []
    for name, args, conc in HELD_OUT:
        data = dataset(tmp_path, f"{name}-{conc}", args)
        runs = [bench(vllm_server, tiny_model, data, conc, tmp_path / f"held-{conc}-{k}-{data.stem}",
                      reset=True) for k in range(REPEATS)]
        held.append((name, conc, runs))
    # the other cache size: its server warmed by 48 requests (the warm-up and one calibration
    # dataset, at concurrency 2), then the same dataset as the first server's
    for warm in ("warm", "two-c2"):
        bench(other_size_server, tiny_model, tmp_path / f"{warm}.jsonl", 2,
              tmp_path / f"{warm}-other-size")
    name, conc, gb = OTHER_SIZE
    data = tmp_path / f"{name.replace(' ', '_')}-{conc}.jsonl"
    held.append((f"{name}, processor cache {gb:g} GiB", conc,
                 [bench(other_size_server, tiny_model, data, conc,
                        tmp_path / f"held-{conc}-{k}-{data.stem}-cache-{gb:g}", reset=True)
                  for k in range(REPEATS)]))
    profile = tmp_path / "fitted.yaml"
    # the step costs from the server's own step lines (the calibration runs' steps), the rest
    # from the runs' records
    proc = mmdatagen("calibrate", *fit_runs, "--base-profile", base, "--output", profile,
                     "--holdout", ",".join(str(runs[0]) for _, _, runs in held),
                     "--engine-log", fit_log)
    print(proc.stdout)
    # kept for the run after this one: what was fitted, and from what (CI keeps artifacts/)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "calibrate.txt").write_text(proc.stdout)
    (ARTIFACTS / "calibrated.yaml").write_bytes(profile.read_bytes())
    assert "held out (not fitted" in proc.stdout

    from mmdatagen.sim import calibrate as cal
    from mmdatagen.sim.profile import load_profile

    prof = load_profile(str(profile))
    failures = []
    for name, conc, runs in held:
        measured = [headline(r) for r in runs]
        run = cal.load_run(runs[0], "vllm-processor")
        predicted = cal.predict(run, prof)
        assert predicted is not None, "the held-out dataset is not at hand"
        sigma = cal.predict_interval(run, prof, predicted)
        assert sigma is not None, "the fitted profile carries no uncertainty"
        row = {"case": f"{name}, concurrency {conc}", "repeats": len(runs)}
        for metric in ("ttft_p50", "throughput"):
            values = [m[metric] for m in measured]
            mean = statistics.fmean(values)
            centre = predicted[metric]
            low, high = (centre - BAND * (centre - sigma[metric][0]),
                         centre + BAND * (sigma[metric][1] - centre))
            beyond = low / mean - 1 if mean < low else high / mean - 1 if mean > high else 0.0
            spread = (max(values) - min(values)) / mean
            row[metric] = {"measured": values, "predicted": centre, "band": [low, high],
                           "error": centre / mean - 1, "beyond": beyond, "spread": spread}
            row[metric]["asserted"] = (name, conc, metric) not in REPORTED_ONLY
            if row[metric]["asserted"] and abs(beyond) > TOLERANCE[metric] + spread:
                failures.append(f"{row['case']} {metric}: predicted {centre:.2f} "
                                f"({low:.2f}..{high:.2f}), measured {values} "
                                f"({beyond:+.1%} beyond the band)")
        CALIBRATION.append(row)
    assert not failures, "; ".join(failures)
