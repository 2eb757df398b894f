"""The engine's own step times for ``calibrate --engine-log``: vLLM started with
``--enable-logging-iteration-details`` logs every engine step (``Iteration(N): C context
requests, T context tokens, G generation requests, ... iteration elapsed time: X ms``, and the
encoder inputs and output embeddings of the step when it ran the encoder).

Those lines measure the step model's costs directly, where the per-request records only see
them summed along a request's life: fitted from requests alone at concurrency 1 and 2, a
decode step's cost per running request came out 3.1 ms where the engine's log shows 0.35, and
throughput at concurrency 8 was over-predicted by up to 44 %. Each step is a row::

    ms = step_base_ms + per_seq_ms x G + per_prefill_token_ms x T
         + per_prefill_context_ms x T^2 / (2 C) / 1000 + per_prefill_request_ms x C
         + per_encoder_token_ms x embeddings + per_encoder_image_ms x inputs

The log does not give a chunk's offset in its prompt nor the decoding requests' prompts: the
prefill pairs are taken as if the step's ``C`` prompts shared its ``T`` tokens evenly from
their starts, except a chunk that continues a prompt (:func:`chunk_offsets`), and
``per_seq_ms`` is a decode step's cost per request at the logged workload's prompts, so
``per_decode_context_ms`` stays at the base profile's value. Fitted from the
records on top, it counted the prompts twice: a decode step of 8 requests of ~2,000 tokens
came out 16.4 ms where the log timed 4.3, and the mean TTFT p50 error over 14 held-out runs
was 19 % against 13 % with it held. Decode-only and prefill steps are weighted by their own
residual spread (``calibrate._solve``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError

#: the step costs the engine's log measures (the rest of ``calibrate.PARAMS`` it cannot see)
STEP_PARAMS = ("step_base_ms", "per_seq_ms", "per_prefill_token_ms", "per_prefill_context_ms",
               "per_prefill_request_ms", "per_encoder_token_ms", "per_encoder_image_ms")
_LINE = re.compile(
    r"Iteration\(\d+\): (\d+) context requests, (\d+) context tokens, (\d+) generation "
    r"requests, (\d+) generation tokens, iteration elapsed time: ([0-9.]+) ms"
    r"(?:.*?encoder inputs: (\d+), encoder output embeddings: (\d+))?")


@dataclass(frozen=True)
class Steps:
    """Per engine step: prefill requests and tokens, decoding requests, encoder inputs and
    embeddings, elapsed ms."""

    context_requests: np.ndarray
    context_tokens: np.ndarray
    generation_requests: np.ndarray
    encoder_inputs: np.ndarray
    encoder_tokens: np.ndarray
    ms: np.ndarray

    def __len__(self) -> int:
        return len(self.ms)


def read_steps(paths: list[Path]) -> Steps:
    """Every step line of the logs; a log without one is refused with the flag to add."""
    rows: list[tuple[float, ...]] = []
    for path in paths:
        found = 0
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if "Iteration(" not in line:
                        continue
                    m = _LINE.search(line)
                    if m:
                        rows.append(tuple(float(g or 0) for g in m.groups()))
                        found += 1
        except OSError as exc:
            raise UserError(f"{path}: unreadable engine log ({exc.strerror or exc})") from None
        if not found:
            raise UserError(f"{path}: no engine step lines (start vLLM with "
                            "--enable-logging-iteration-details)")
    a = np.array(rows, dtype=float)
    return Steps(a[:, 0], a[:, 1], a[:, 2], a[:, 5], a[:, 6], a[:, 4])


def chunk_offsets(steps: Steps, token_budget: int) -> np.ndarray:
    """Per step, the prompt tokens computed before its chunk when the step continues a chunked
    prompt, else 0. A step of one prompt that fills the token budget (with the step's decode
    tokens) leaves the rest of that prompt to the next step, so a next step of one prompt
    continues it: its chunk attends the earlier chunks too (a 3,100-token prompt's second chunk
    of 1,050 tokens attends 2.7 million pairs, not the 0.55 million of a prompt's start).
    A full step of several prompts is taken as ending them all (the log does not say which
    one was cut)."""
    c, t, g = steps.context_requests, steps.context_tokens, steps.generation_requests
    offsets = np.zeros(len(steps))
    carry = 0.0
    for i in range(len(steps)):
        single = c[i] == 1
        offsets[i] = carry if single else 0.0
        carry = offsets[i] + t[i] if single and t[i] + g[i] >= token_budget else 0.0
    return offsets


def step_rows(steps: Steps, params: tuple[str, ...], token_budget: int | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Design rows over ``params`` (columns of the others 0), elapsed ms, and each row's set
    (``decode`` or ``prefill``) for the fit's weights. With the engine's ``token_budget``, a
    chunk that continues a prompt attends its earlier chunks (:func:`chunk_offsets`)."""
    c, t = steps.context_requests, steps.context_tokens
    offsets = (np.zeros(len(steps)) if token_budget is None
               else chunk_offsets(steps, token_budget))
    pairs = np.where(c > 0, t * t / (2.0 * np.maximum(c, 1.0)) + t * offsets, 0.0)
    cols = {"step_base_ms": np.ones(len(steps)), "per_seq_ms": steps.generation_requests,
            "per_prefill_token_ms": t,
            "per_prefill_context_ms": pairs / 1000.0,
            "per_prefill_request_ms": c, "per_encoder_token_ms": steps.encoder_tokens,
            "per_encoder_image_ms": steps.encoder_inputs}
    x = np.column_stack([cols.get(p, np.zeros(len(steps))) for p in params])
    label = np.where(c > 0, "prefill", "decode")
    return x, steps.ms, label
