"""vLLM 0.32's encoder-cache budget == ``mmdatagen.media_tokens.encoder_cache_budget``.

Two checks:
- logged: a real server per set of flags, started only until its log prints "Encoder cache will
  be initialized with a budget of N tokens" (then killed); N == the library's rule. The line
  comes from the profiling run, which the CPU worker skips in eager mode, so these servers run
  with compilation on (killed before it compiles anything);
- computed: vLLM's own ``MultiModalBudget`` (what the scheduler sizes its encoder cache with and
  the model runner logs), run in the engine virtualenv without a server, over a grid of batched
  tokens, context lengths, modality limits and image pixel limits (variants of the tiny model
  whose largest image is 1,278 and 400 tokens exercise the aspect-ratio search); each == the rule.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from . import servers, setup_engine
from .conftest import ARTIFACTS
from .engine import BUDGET_LINE, OFFLINE_ENV, TIMINGS, VllmServer, stop_group

pytestmark = pytest.mark.real_engine

HERE = Path(__file__).resolve().parent

# (max_num_batched_tokens, max_model_len, --limit-mm-per-prompt) -> what decides the budget
# One server start (50-120 s) stays within the suite's budget: the least obvious case. The
# largest image (512 batched, image:3 video:0 -> 1,280, not 3 images), the batched-tokens case
# (8,192 with image:1 video:0 -> 8,192) and the explicit 6-frame video (2,048, image:2 video:1
# -> 3,840) were logged too when the rule was derived, and the computed grid below covers them.
LOGGED = [
    (512, 8192, {"image": 3}),  # video omitted = 999 videos: a 12-frame video (7,680)
]


class UntilLogged(VllmServer):
    """A server that counts as started once its log prints the encoder-cache budget (or, when
    it never does, once it serves), and that is killed at once rather than asked to stop."""

    def _health(self) -> bool:
        return BUDGET_LINE.search(self.log_text()) is not None or super()._health()

    def kill(self) -> None:
        """SIGKILL the group at once (its shared-memory segments removed, as ``stop`` does)."""
        stop_group(self.proc, self.watchdog, signals=((signal.SIGKILL, 30.0),))


def _rule(model_dir: Path, batched: int, model_len: int, limits: dict) -> int:
    from mmdatagen.media_tokens import encoder_cache_budget
    from mmdatagen.vlm import resolve_model

    return encoder_cache_budget(resolve_model(path=model_dir), batched, limits, model_len)


def _tag(batched: int, model_len: int, limits: dict) -> str:
    return f"{batched}-{model_len}-" + "-".join(f"{k}{v}" for k, v in limits.items())


class BudgetServers:
    """One ``UntilLogged`` server per ``LOGGED`` case, started together (``servers.start_all``)
    with the suite's other servers, each killed once logged."""

    def __init__(self, python: Path, model: Path) -> None:
        self.servers = {_tag(*case): UntilLogged(
            python, model, ARTIFACTS / f"vllm-budget-{_tag(*case)}.log", processor_cache_gb=0.005,
            max_num_batched_tokens=case[0], max_images=1, max_model_len=case[1],
            # the later flags win: compilation on (the line is logged from the profiling run),
            # and the limits as given (a modality may be omitted)
            extra_args=["--compilation-config", json.dumps({"mode": 3}),
                        "--limit-mm-per-prompt", json.dumps(case[2])]) for case in LOGGED}
        self.waiting = dict(self.servers)

    def begin(self) -> None:
        for server in self.servers.values():
            server.begin()

    def step(self) -> bool:
        for tag, server in list(self.waiting.items()):
            if server.step():
                server.kill()
                TIMINGS[f"budget server {tag} (until logged)"] = server.start_seconds or 0.0
                del self.waiting[tag]
        return not self.waiting

    def stop(self) -> None:
        for server in self.servers.values():
            server.kill()


servers.register("budget_servers", setup_engine.ensure, BudgetServers)


@pytest.fixture(scope="module")
def budget_servers(started) -> BudgetServers:
    return started.get("budget_servers")


@pytest.mark.parametrize("batched,model_len,limits", LOGGED,
                         ids=[f"mnbt{b}-len{n}-{json.dumps(lim)}" for b, n, lim in LOGGED])
def test_logged_budget_equals_the_rule(budget_servers, tiny_model, batched, model_len, limits):
    server = budget_servers.servers[_tag(batched, model_len, limits)]
    line = BUDGET_LINE.search(server.log_text())
    assert line is not None, f"no budget line in {server.log_path}:\n{server.tail()}"
    taken = re.search(r"'limit_mm_per_prompt': (\{[^}]*\})", server.log_text())
    assert taken and ast.literal_eval(taken.group(1)) == limits, "limits not taken as given"
    assert int(line.group(1)) == _rule(tiny_model, batched, model_len, limits), line.group(0)


def _variant(tiny_model: Path, folder: Path, merged_patches: int) -> Path:
    """The tiny model with its image processor's max_pixels set to ``merged_patches`` x 28^2."""
    shutil.copytree(tiny_model, folder)
    path = folder / "processor_config.json"
    config = json.loads(path.read_text())
    config["image_processor"]["size"]["longest_edge"] = merged_patches * 28 * 28
    path.write_text(json.dumps(config, indent=1))
    return folder


def test_vllm_multimodal_budget_equals_the_rule(engine_python, tiny_model, tmp_path):
    models = [tiny_model, _variant(tiny_model, tmp_path / "tiny1279", 1279),
              _variant(tiny_model, tmp_path / "tiny401", 401)]
    limits = [{"image": 3, "video": 0}, {"image": 3}, {"image": 0, "video": 1},
              {"image": 0, "video": 0}]
    cases = [{"model": str(m), "max_num_batched_tokens": b, "max_model_len": n,
              "limit_mm_per_prompt": lim}
             for m in models for b in (256, 1000, 5000) for n in (1024, 4096, 32768)
             for lim in limits]
    started = time.monotonic()
    proc = subprocess.run([str(engine_python), str(HERE / "vllm_budget.py")],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=900,
                          env={**os.environ, **OFFLINE_ENV})
    TIMINGS["vLLM MultiModalBudget grid"] = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")]
    assert len(results) == len(cases), proc.stderr[-4000:]
    wrong = []
    for case, got in zip(cases, results):
        assert got["max_num_batched_tokens"] == case["max_num_batched_tokens"], got
        assert got["budget"] == got["cache"], got  # the logged value is the cache's size
        want = _rule(Path(case["model"]), case["max_num_batched_tokens"], case["max_model_len"],
                     case["limit_mm_per_prompt"])
        if got["budget"] != want:
            wrong.append((case, got, want))
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]}"
    kinds = {tuple(sorted(r["max_tokens_per_item"])) for r in results}
    assert kinds == {(), ("image",), ("video",), ("image", "video")}, kinds
