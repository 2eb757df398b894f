"""``mmdatagen calibrate``: runs simulated in virtual time with a KNOWN profile (vLLM's processor
cache on and off, concurrency 1 and 2, three datasets) are calibrated; the fitted costs must be
the known ones, and the fitted profile must predict held-out runs (concurrency 8, another
dataset and image size) within 15 %. Refusals: runs that cannot identify a cost."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from mmdatagen.cli import cli
from mmdatagen.sim import calibrate as cal
from mmdatagen.sim import whatif
from mmdatagen.sim.profile import load_profile

KNOWN = {"step_base_ms": 4.0, "per_seq_ms": 0.3, "per_prefill_token_ms": 0.02,
         "per_encoder_image_ms": 12.0, "frontend_request_ms": 1.5, "frontend_image_ms": 7.0,
         "per_encoder_token_ms": 0.01, "per_prefill_context_ms": 0.004,
         "per_decode_context_ms": 0.2, "per_prefill_request_ms": 0.0}
# the engine's work per request with prompt tokens in a step: from requests alone it is kept
# at the base profile's value (a known 3 ms fitted from them came out with per_seq_ms 32 %
# high: the decode windows' rows only approximate another request's prefill); it is fitted
# from the engine's own step lines (--engine-log), tested below
# plain vLLM: the processor cache (the target) and the encoder cache beside it, whose hits
# calibrate replays from the datasets; text at 6 bytes per token, which calibrate measures
PROFILE = {"description": "known profile of the calibrate test", "model": "qwen3-vl-30b-a3b",
           "cache": "vllm-processor", "max_running": 64, "token_budget": 8192,
           "encoder_cache": True, "encoder_budget": 2048,
           "natural_output_tokens": 32, "text_bytes_per_token": 6.0, **KNOWN}
# dataset name -> pool flags: prompt lengths and images per request vary independently
DATASETS = {"a": ["-n", "40", "--pool-size", "10", "--text-tokens", "200", "--seed", "0"],
            "b": ["-n", "40", "--pool-size", "10", "--text-tokens", "600", "--seed", "1",
                  "--images-per-request", "2", "--image-size", "1024x768"],
            "d": ["-n", "40", "--pool-size", "10", "--text-tokens", "1200", "--seed", "3"],
            "e": ["-n", "30", "--pool-size", "30", "--text-tokens", "2400", "--seed", "4",
                  "--image-size", "320x240"],
            "c": ["-n", "60", "--pool-size", "20", "--text-tokens", "400", "--seed", "2",
                  "--image-size", "800x600"]}
# (dataset, concurrency, processor cache GiB)
TRAIN = [("a", 1, 4), ("a", 1, 0), ("b", 1, 4), ("d", 1, 4), ("d", 2, 0), ("a", 2, 4),
         ("e", 1, 4)]
HELD_OUT = [("c", 8, 4), ("a", 8, 0)]
# relative tolerance of each recovered cost: the decode-window rows approximate how a request
# overlapping another in part spreads its tokens, which biases the step's split (base vs per
# running sequence) by a few percent at concurrency 2
TOLERANCE = {"step_base_ms": 0.03, "per_seq_ms": 0.15, "per_prefill_token_ms": 0.03,
             "per_encoder_image_ms": 0.03, "frontend_request_ms": 0.10,
             "frontend_image_ms": 0.03, "per_encoder_token_ms": 0.05,
             "per_prefill_context_ms": 0.05, "per_decode_context_ms": 0.10,
             "per_prefill_request_ms": 0.5}  # ms: the engine's per-request work is 0 here


def _invoke(*args: object) -> tuple[int, str]:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, int, float], Path]:
    root = tmp_path_factory.mktemp("calibrate")
    (root / "known.yaml").write_text(yaml.safe_dump(PROFILE))
    for name, flags in DATASETS.items():
        code, out = _invoke("pool", *flags, "--tokenizer", "words", "--image-content", "solid",
                            "-o", root / f"{name}.jsonl", "--quiet")
        assert code == 0, out
    folders = {}
    for ds, conc, size in TRAIN + HELD_OUT:
        folder = root / f"run_{ds}_{conc}_{size}"
        code, out = _invoke("simulate", root / f"{ds}.jsonl", "--profile", root / "known.yaml",
                            "--concurrency", conc, "--cache-size", size, "--output-dir", folder,
                            "--quiet")
        assert code == 0, out
        folders[(ds, conc, size)] = folder
    return folders


def test_recovers_known_costs_and_predicts_held_out(runs, tmp_path):
    out = tmp_path / "fitted.yaml"
    code, text = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", out, "--base-profile",
                         runs[TRAIN[0]].parent / "known.yaml")
    assert code == 0, text
    assert "± se" in text and "run_d_2_0" in text
    prof = load_profile(str(out))  # a normal profile
    assert prof.cache == "vllm-processor" and prof.max_running == 64
    params = prof.calibration["parameters"]
    # text tokens are ceil(bytes / 6) per text: slightly more tokens than bytes / 6
    assert 5.7 <= prof.text_bytes_per_token <= 6.0, prof.text_bytes_per_token
    assert "text_bytes_per_token" in text and prof.encoder_cache
    for name, true in KNOWN.items():
        got = getattr(prof, name)
        print(name, got, true)
        if true == 0.0:  # zeroed, or fitted as good as nothing
            assert got <= TOLERANCE[name], (name, got)
            continue
        assert abs(got / true - 1) <= TOLERANCE[name], (name, got, true)
        assert params[name]["se"] > 0
    corr = np.array(prof.calibration["correlation"])  # what the what-if's interval uses
    assert corr.shape == (len(cal.PARAMS),) * 2 and np.allclose(corr, corr.T)
    fitted = [i for i, p in enumerate(cal.PARAMS)
              if p not in prof.calibration["zeroed"] + prof.calibration["held"]]
    assert np.allclose(np.diag(corr)[fitted], 1.0) and np.all(np.abs(corr) <= 1.0)
    assert np.all(np.linalg.eigvalsh(corr) > -1e-9)  # a covariance, positive semi-definite
    for key in HELD_OUT:
        run = cal.load_run(runs[key], "vllm-processor")
        measured, predicted = cal.measured(run), cal.predict(run, prof)
        assert predicted is not None
        for metric in ("ttft_p50", "throughput"):
            assert abs(predicted[metric] / measured[metric] - 1) <= 0.15, (key, metric)


def test_fitted_profile_runs_with_simulate(runs, tmp_path):
    out = tmp_path / "fitted.yaml"
    known = runs[TRAIN[0]].parent / "known.yaml"
    code, text = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", out, "--quiet",
                         "--base-profile", known)
    assert code == 0, text
    rows = {}
    for name, prof in (("fit", out), ("known", known)):
        code, text = _invoke("simulate", runs[TRAIN[0]].parent / "c.jsonl", "--profile", prof,
                             "--concurrency", 4, "--cache-size", "0,4", "--request-count", 20,
                             "--output-dir", tmp_path / name)
        assert code == 0, text
        # the what-if of a fitted profile has intervals, the known profile's has none
        assert "Hit rate" in text and ("interval: ±1 sigma" in text) == (name == "fit")
        rows[name] = json.loads((tmp_path / name / "sweep.json").read_text())["rows"]
    for f, k in zip(rows["fit"], rows["known"]):
        assert f["hit_rate"] == k["hit_rate"]
        for metric in ("time_to_first_token", "ttft_p50", "request_throughput"):
            lo, hi = f["interval"][metric]
            assert lo < f[metric] < hi and "interval" not in k
            assert abs(f[metric] / k[metric] - 1) <= 0.15, (metric, f, k)


def test_refuses_runs_without_hits(runs, tmp_path):
    """Cache off everywhere: what a hit saves cannot be fitted; the line says what to add."""
    code, text = _invoke("calibrate", runs[("a", 1, 0)], runs[("d", 2, 0)], runs[("b", 1, 4)],
                         runs[("e", 1, 4)], "-o", tmp_path / "f.yaml", "--base-profile",
                         runs[TRAIN[0]].parent / "known.yaml")
    assert code == 0, text  # b's hits identify it
    code, text = _invoke("calibrate", runs[("a", 1, 0)], runs[("d", 2, 0)],
                         "-o", tmp_path / "g.yaml")
    assert code == 2
    assert "frontend_image_ms (no cache hits at all: add a run whose images repeat" in text
    assert not (tmp_path / "g.yaml").exists()


def test_the_servers_frontend_stage_gives_the_cost_per_preprocessed_image(runs):
    """The server's own frontend stage of the runs at concurrency 1 (``server_stages``; here
    the simulator's), each about their mean: its slope against the images preprocessed per
    request is the cost per image (the constant, which also holds the client's part, is the
    TTFT rows'). No rows without the stages, or from one such run alone."""
    from dataclasses import replace

    loaded = [cal.load_run(runs[k], "vllm-processor") for k in TRAIN]
    x, y = cal.stage_rows(loaded)
    col = cal.PARAMS.index("frontend_image_ms")
    assert len(y) == sum(1 for k in TRAIN if k[1] == 1) == 5
    assert not np.delete(x, col, axis=1).any() and abs(y.sum()) < 1e-9
    assert np.polyfit(x[:, col], y, 1)[0] == pytest.approx(KNOWN["frontend_image_ms"], rel=0.01)
    assert not len(cal.stage_rows([replace(r, stages=None) for r in loaded])[1])
    assert not len(cal.stage_rows(loaded[:1])[1])
    # a server whose frontend stage says 3 ms more per preprocessed image: the fit moves toward
    # it although the TTFT rows still say 7 (the stage rows' spread is far below theirs)
    moved = [replace(r, stages={**r.stages, "frontend": r.stages["frontend"]
                                + 3.0 * float(r.processed.mean())}) if r.stages else r
             for r in loaded]
    hold = {"per_prefill_request_ms": 0.0, "per_encoder_token_ms": 0.0}  # no image tokens
    assert cal.fit(loaded, hold).values["frontend_image_ms"] == pytest.approx(7.0, rel=0.03)
    assert cal.fit(moved, hold).values["frontend_image_ms"] > 7.5


def test_refuses_concurrency_one_only_unless_held(runs, tmp_path):
    alone = [runs[k] for k in TRAIN if k[1] == 1]
    code, text = _invoke("calibrate", *alone, "-o", tmp_path / "f.yaml")
    assert code == 2
    assert "per_seq_ms (every request ran alone" in text and "concurrency 2 or more" in text
    code, text = _invoke("calibrate", *alone, "-o", tmp_path / "f.yaml", "--hold",
                         "per_seq_ms", "--base-profile", runs[TRAIN[0]].parent / "known.yaml")
    assert code == 0, text
    assert load_profile(str(tmp_path / "f.yaml")).per_seq_ms == KNOWN["per_seq_ms"]


def test_bad_input_is_one_line(runs, tmp_path):
    code, text = _invoke("calibrate", tmp_path, "-o", tmp_path / "f.yaml")
    assert code == 2 and "no records.jsonl" in text
    code, text = _invoke("calibrate", runs[TRAIN[0]], "-o", tmp_path / "f.yaml", "--hold", "x")
    assert code == 2 and "unknown parameters x" in text


def test_holdout_runs_are_replayed_not_fitted(runs, tmp_path):
    out = tmp_path / "fitted.yaml"
    known = runs[TRAIN[0]].parent / "known.yaml"
    held = ",".join(str(runs[k]) for k in HELD_OUT)
    code, text = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", out, "--base-profile",
                         known, "--holdout", held)
    assert code == 0, text
    fitted_part, held_part = text.split("held out (not fitted")
    assert "run_c_8_4" in held_part and "run_c_8_4" not in fitted_part
    prof = load_profile(str(out))
    assert not any("run_c_8_4" in r for r in prof.calibration["runs"])
    # the same fit as without --holdout
    code, _ = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", tmp_path / "alone.yaml",
                      "--base-profile", known, "--quiet")
    assert code == 0
    alone = load_profile(str(tmp_path / "alone.yaml"))
    assert all(getattr(alone, p) == getattr(prof, p) for p in cal.PARAMS)
    for line in held_part.strip().splitlines()[1:3]:  # measured, predicted and the error
        assert line.count("%") == 2, line
        assert line.count(" ±") == 2, line  # the prediction's 1 sigma, TTFT and req/s


def test_a_cost_fitted_negative_is_held_at_zero():
    """Costs are not negative: least squares that would go below 0 holds that cost at 0."""
    rng = np.random.default_rng(0)
    n = 200
    x = np.zeros((n, len(cal.PARAMS)))
    x[:, 0] = x[:, 1] = 1.0
    x[:, 3] = rng.uniform(100, 2000, n)  # prompt tokens
    x[:, 4] = x[:, 5] = rng.integers(0, 3, n)  # the image columns move together...
    x[:, 5] += rng.integers(0, 2, n)  # ...but not only
    x[:, cal.TOKENS] = x[:, 5] * 300
    x[:, cal.CONTEXT] = x[:, 3] ** 2 / 2000
    y = 5.0 + 0.02 * x[:, 3] + 10.0 * x[:, 4] - 0.5 * x[:, 5] + rng.normal(0, 0.5, n)
    label = np.array(["ttft"] * n)
    hold = {"per_seq_ms": 0.0, "per_decode_context_ms": 0.0, "step_base_ms": 0.0}
    result = cal._nonnegative(x, y, label, hold)
    assert result.zeroed and all(result.values[p] == 0.0 for p in result.zeroed)
    assert all(v >= 0.0 for v in result.values.values())


def test_a_cost_held_at_zero_keeps_its_uncertainty():
    """A cost the fit holds at 0 (its least squares went below) keeps the standard error and
    the correlation of the unbounded fit, so the what-if's interval still moves it: per
    request and per image trade off, and with the first at 0 and an se of 0 the interval left
    out what the data cannot tell apart."""
    rng = np.random.default_rng(1)
    n = 300
    x = np.zeros((n, len(cal.PARAMS)))
    x[:, 0] = 1.0  # frontend_request_ms
    x[:, 3] = rng.uniform(100, 2000, n)  # prompt tokens
    x[:, 4] = rng.integers(0, 4, n)  # frontend_image_ms: images preprocessed
    y = -1.0 + 0.02 * x[:, 3] + 10.0 * x[:, 4] + rng.normal(0, 2.0, n)
    label = np.array(["ttft"] * n)
    hold = {p: 0.0 for i, p in enumerate(cal.PARAMS) if i not in (0, 3, 4)}
    result = cal._nonnegative(x, y, label, hold)
    request, image = cal.PARAMS.index("frontend_request_ms"), cal.PARAMS.index(
        "frontend_image_ms")
    assert result.zeroed == ("frontend_request_ms",)
    assert result.values["frontend_request_ms"] == 0.0
    free = [0, 3, 4]  # the same data without the bound
    unbounded = cal._solve(x[:, free], y, label, [cal.PARAMS[i] for i in free], hold)
    assert unbounded.values["frontend_request_ms"] < 0.0
    se = result.se["frontend_request_ms"]
    assert 0.8 <= se / unbounded.se["frontend_request_ms"] <= 1.25, se
    corr = np.array(result.correlation)
    assert corr[request, image] < -0.3 and corr[request, request] == 1.0
    assert np.all(np.linalg.eigvalsh(corr) > -1e-9)
    prof = cal.fitted_profile(load_profile("zero-delay"), result, [], "fitted")
    names, cov = whatif.uncertainty(prof)
    assert "frontend_request_ms" in names and cov[names.index("frontend_request_ms")].any()
    moved = [p.frontend_request_ms for pair in whatif.sigma_points(prof)
             for p in pair]
    assert min(moved) == 0.0 and max(moved) > 0.5 * se  # moved up, held at 0 below


def test_the_engine_keeps_vllms_encoder_cache_beside_the_processor_cache():
    """A profile with ``encoder_cache``: a repeated image skips the encoder (its tokens no
    longer in the step), while the processor cache's hits are unchanged."""
    from mmdatagen.sim.engine import Engine, SimImage, SimRequest
    from mmdatagen.sim.profile import Profile

    img = SimImage(key="x", tokens=300, prompt_tokens=302, nbytes=1 << 20)
    done = {}
    for keep in (False, True):
        prof = Profile(cache="vllm-processor", encoder_cache=keep, encoder_budget=4096,
                       per_encoder_token_ms=1.0, step_base_ms=1.0)
        eng = Engine(prof, 0.0)  # processor cache off: no hits there
        durations = []
        for rid in range(3):
            req = SimRequest(rid, 10, [img], 1)
            eng.frontend_ready_at(req, 0.0)
            eng.add(req)
            durations.append(eng.begin_step(0.0))
            eng.end_step(durations[-1])
            assert req.hits == 0
        done[keep] = (durations, eng.encoded_images)
    plain, kept = done[False], done[True]
    assert plain[1] == 3 and len(set(plain[0])) == 1  # encoded every time, same step
    assert kept[1] == 1 and kept[0][1:] == [kept[0][0] - 300.0] * 2  # 300 tokens at 1 ms


def test_the_zero_delay_path_releases_vllms_encoder_cache_entries():
    """``Engine.instant`` (no steps) releases a request's encoder entries as a step would, so
    they can be evicted: x, y fill a two-entry cache, z evicts x, and z again is a hit (entries
    left pinned would keep z out, and the second z would be encoded again)."""
    from mmdatagen.sim.engine import Engine, SimImage, SimRequest
    from mmdatagen.sim.profile import Profile

    images = [SimImage(key=k, tokens=300, prompt_tokens=302, nbytes=1 << 20) for k in "xyzz"]
    eng = Engine(Profile(cache="vllm-processor", encoder_cache=True, encoder_budget=600), 0.0)
    for rid, img in enumerate(images):
        eng.instant(SimRequest(rid, 10, [img], 1), 0.0)
    assert eng.encoder.hits == 1 and eng.encoder.evictions == 1


def test_session_runs_are_matched_to_their_dataset_turns(tmp_path):
    """A sliding-window run (single_turn rows with a session_id, which carry no turn index of
    their own) is read with its dataset: every record finds its turn, its turn index being the
    row's order within its session, in the simulator's records as in the loader's. Before,
    only each session's first row matched (calibrate refused the run as if its dataset were
    missing), and the simulator wrote 0 for every turn of such a session."""
    from mmdatagen.sim.calibrate_terms import run_turns

    data, folder = tmp_path / "s.jsonl", tmp_path / "run"
    code, out = _invoke("sliding-window", "--users", "3", "--turns", "4", "--window", "2",
                        "--image-size", "224x224:1,640x480:1", "--text-tokens", "50",
                        "--image-content", "solid", "-o", data, "--quiet")
    assert code == 0, out
    (tmp_path / "known.yaml").write_text(yaml.safe_dump(PROFILE))
    code, out = _invoke("simulate", data, "--profile", tmp_path / "known.yaml", "--concurrency",
                        2, "--cache-size", 4, "--output-dir", folder, "--quiet")
    assert code == 0, out
    run = cal.load_run(folder, "vllm-processor")
    turns = run_turns(run, load_profile(str(tmp_path / "known.yaml")))
    assert turns is not None and len(turns) == len(run.table) == 12
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    for cid, idx, turn in zip(run.table.conversation_id.tolist(), run.table.turn_index.tolist(),
                              turns):
        assert turn.session == cid
        mine = [r for r in rows if r["session_id"] == cid]
        assert len(turn.images) == len(mine[idx]["images"])
    for cid in set(run.table.conversation_id.tolist()):
        mine = run.table.conversation_id == cid
        assert sorted(run.table.turn_index[mine].tolist()) == [0, 1, 2, 3]
    assert {t.turn_index for t in turns} == {0}  # the rows' own index: not what matches them


STEP_KNOWN = {"step_base_ms": 3.0, "per_seq_ms": 0.35, "per_prefill_token_ms": 0.08,
              "per_prefill_context_ms": 0.01, "per_prefill_request_ms": 12.0,
              "per_encoder_token_ms": 0.28, "per_encoder_image_ms": 2.0}


def _engine_log(path: Path, k: dict[str, float], steps: int = 1500, seed: int = 0) -> Path:
    """A vLLM log (``--enable-logging-iteration-details``) whose step times follow the costs
    ``k`` with 3 % noise, between other lines as the server writes them."""
    rng = np.random.default_rng(seed)
    lines = ["(APIServer pid=1) INFO 11-28 03:32:29 [api_utils.py:286] non-default args: {}"]
    for i in range(steps):
        gen = int(rng.integers(0, 9))
        ctx = int(rng.integers(1, 3)) if i % 5 == 0 or gen == 0 else 0
        tokens = int(rng.integers(100, 2048)) if ctx else 0
        images = int(rng.integers(0, 4)) if ctx else 0
        emb = images * int(rng.choice([64, 391])) if images else 0
        ms = (k["step_base_ms"] + k["per_seq_ms"] * gen + k["per_prefill_token_ms"] * tokens
              + k["per_prefill_context_ms"] * (tokens * tokens / (2 * ctx) if ctx else 0) / 1000
              + k["per_prefill_request_ms"] * ctx + k["per_encoder_token_ms"] * emb
              + k["per_encoder_image_ms"] * images)
        ms *= 1 + rng.normal(0, 0.03)
        tail = f", encoder inputs: {images}, encoder output embeddings: {emb}" if images else ""
        lines.append(f"(APIServer pid=1) INFO 11-28 03:33:37 [loggers.py:199] Engine 000: "
                     f"Iteration({i}): {ctx} context requests, {tokens} context tokens, {gen} "
                     f"generation requests, {gen} generation tokens, iteration elapsed time: "
                     f"{ms:.2f} ms, CPU KV cache usage: 0.0%{tail}")
        if i % 100 == 0:
            lines.append("(APIServer pid=1) INFO:     127.0.0.1:1 - \"POST /v1/chat/completions"
                         " HTTP/1.1\" 200 OK")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_engine_log_gives_the_step_costs(tmp_path):
    """vLLM's own step lines: every step cost it varies is recovered, with its se."""
    from mmdatagen.sim.calibrate_steps import read_steps

    steps = read_steps([_engine_log(tmp_path / "vllm.log", STEP_KNOWN)])
    assert len(steps) == 1500
    fit = cal.fit_steps(steps, {})
    assert set(fit.from_log) == set(STEP_KNOWN)
    for name, true in STEP_KNOWN.items():  # attention's part is the smallest: 15 %
        assert abs(fit.values[name] / true - 1) <= 0.15 if name == "per_prefill_context_ms" \
            else 0.05, (name, fit.values[name], true)
        assert 0 < fit.se[name] < 0.25 * true, (name, fit.se[name])
    # a cost the steps never vary (no encoder ran) is left to the records
    held = cal.fit_steps(steps, {"per_encoder_token_ms": 0.0, "per_encoder_image_ms": 0.0})
    assert "per_encoder_token_ms" not in held.from_log


def _chunked_steps(k: dict[str, float], budget: int, seed: int = 1):
    """Steps of one request at a time (as at concurrency 1) whose prompts of 1,000-5,000 tokens
    are chunked at ``budget``; a continued chunk attends the earlier ones, as in the engine."""
    from mmdatagen.sim.calibrate_steps import Steps

    rng = np.random.default_rng(seed)
    rows = []

    def step(c: int, t: int, g: int, pairs: float) -> None:
        ms = (k["step_base_ms"] + k["per_seq_ms"] * g + k["per_prefill_token_ms"] * t
              + k["per_prefill_context_ms"] * pairs / 1000 + k["per_prefill_request_ms"] * c)
        rows.append((c, t, g, ms * (1 + rng.normal(0, 0.02))))

    for _ in range(120):
        left, done = int(rng.integers(1000, 5000)), 0
        while left:
            g = int(rng.integers(0, 3))  # other requests' decode tokens share the budget
            chunk = min(left, budget - g)
            step(1, chunk, g, chunk * (done + chunk / 2))
            left, done = left - chunk, done + chunk
        step(2, 400, 0, 400 * 400 / 4)  # two short prompts of 200 tokens
        for g in (1, 2, 3):
            step(0, 0, g, 0.0)
    a = np.array(rows, dtype=float)
    zero = np.zeros(len(a))
    return Steps(a[:, 0], a[:, 1], a[:, 2], zero, zero, a[:, 3])


def test_a_continued_chunk_attends_the_earlier_chunks():
    """A step of one prompt that fills the token budget is continued by the next step of one
    prompt: its offset is what the earlier chunks computed. With the budget the fit recovers
    attention's cost; read as if every chunk began a prompt, it comes out far off."""
    from mmdatagen.sim.calibrate_steps import Steps, chunk_offsets

    a = np.array([(1, 2048, 0), (1, 2048, 0), (1, 500, 0), (0, 0, 1), (1, 2047, 1),
                  (1, 300, 0), (2, 2048, 0), (1, 10, 0)], dtype=float)
    zero = np.zeros(len(a))
    steps = Steps(a[:, 0], a[:, 1], a[:, 2], zero, zero, zero)
    # the fifth step fills the budget with its decode token: the sixth continues it
    assert chunk_offsets(steps, 2048).tolist() == [0, 2048, 4096, 0, 0, 2047, 0, 0]
    k = {"step_base_ms": 3.0, "per_seq_ms": 0.35, "per_prefill_token_ms": 0.08,
         "per_prefill_context_ms": 0.01, "per_prefill_request_ms": 2.0}
    hold = {"per_encoder_token_ms": 0.0, "per_encoder_image_ms": 0.0}
    chunked = _chunked_steps(k, 2048)
    fit = cal.fit_steps(chunked, hold, 2048)
    for name, true in k.items():
        assert fit.values[name] == pytest.approx(true, rel=0.1), (name, fit.values[name])
    blind = cal.fit_steps(chunked, hold).values["per_prefill_context_ms"]
    assert abs(blind / k["per_prefill_context_ms"] - 1) > 0.5, blind


@pytest.mark.parametrize("between", [0.0, 1.5])
def test_calibrate_with_an_engine_log(runs, tmp_path, between):
    """--engine-log: the step costs come from the engine's steps (marked log), the records fit
    the frontend's and a step's constant: the log's timer leaves out the engine's work between
    steps (``between`` ms of the runs' 4 ms); a log without step lines is one line and exit 2,
    nothing written."""
    # the engine of the runs, as its log would show it
    steps = {p: KNOWN.get(p, 0.0) for p in STEP_KNOWN}
    log = _engine_log(tmp_path / "vllm.log", {**steps, "step_base_ms": 4.0 - between})
    known = runs[TRAIN[0]].parent / "known.yaml"
    out = tmp_path / "fitted.yaml"
    code, text = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", out, "--base-profile",
                         known, "--engine-log", log)
    assert code == 0, text
    assert "engine log: 1500 steps" in text and " log " in text
    seen = re.search(r"step_base_ms from the decode windows: ([0-9.]+) ms, the log's steps "
                     r"alone ([0-9.]+) ms", text)
    assert seen, text
    assert abs(float(seen[1]) - float(seen[2]) - between) <= 0.15, seen[0]
    prof = load_profile(str(out))
    assert set(prof.calibration["from_engine_log"]) == set(STEP_KNOWN) - {"step_base_ms"}
    for name in ("step_base_ms", "per_seq_ms", "per_encoder_image_ms", "per_prefill_token_ms"):
        assert abs(getattr(prof, name) / KNOWN[name] - 1) <= 0.05, name
    assert prof.per_prefill_request_ms <= 0.5  # none in this engine
    # the records fit the rest: what the frontend spends
    assert "frontend_image_ms" not in prof.calibration["from_engine_log"]
    assert abs(prof.frontend_image_ms / KNOWN["frontend_image_ms"] - 1) <= 0.05
    assert prof.calibration["parameters"]["frontend_image_ms"]["se"] > 0
    # the log's costs keep their uncertainty: their own correlation (1 on the diagonal), none
    # with the records' costs, so the what-if intervals move them too
    corr = np.array(prof.calibration["correlation"])
    at = {p: cal.PARAMS.index(p) for p in prof.calibration["from_engine_log"]}
    assert all(corr[i, i] == 1.0 for i in at.values())
    assert corr[at["per_seq_ms"], cal.PARAMS.index("frontend_image_ms")] == 0.0
    moved = set(whatif.uncertainty(prof)[0])
    assert set(at) <= moved and "frontend_image_ms" in moved
    empty = tmp_path / "plain.log"
    empty.write_text("INFO started\n")
    code, text = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", tmp_path / "g.yaml",
                         "--base-profile", known, "--engine-log", empty)
    assert code == 2 and "--enable-logging-iteration-details" in text
    assert len(text.strip().splitlines()) == 1 and not (tmp_path / "g.yaml").exists()


def test_the_report_shows_the_servers_stages_measured_and_replayed(runs, tmp_path):
    """Runs whose server reported where a request's time goes (``server_stages``: here the
    known profile's simulator) are shown stage by stage against the fitted profile's replay;
    a fit that recovers the costs replays the stages too."""
    from mmdatagen.metrics import STAGES

    known = runs[TRAIN[0]].parent / "known.yaml"
    code, text = _invoke("calibrate", *(runs[k] for k in TRAIN), "-o", tmp_path / "f.yaml",
                         "--base-profile", known, "--holdout", str(runs[HELD_OUT[0]]))
    assert code == 0, text
    head, table = text.split("where a request's time goes on the server")
    lines = [line for line in table.splitlines() if "/run_" in line]
    assert len(lines) == len(TRAIN) + 1 and "run_c_8_4" in lines[-1]
    for line in lines:
        cells = [c.split("/") for c in line.split()[1:]]
        assert len(cells) == len(STAGES), line
        for measured, replayed in ((float(a), float(b)) for a, b in cells):
            assert replayed == pytest.approx(measured, rel=0.1, abs=1.0), line
