"""What a measured run's dataset adds to ``calibrate``: the engine's text tokens per byte, and
the images vLLM's encoder cache spared the encoder.

A real server counts a prompt's tokens with its own tokenizer (``input_tokens`` of the
records); the simulator counts text as UTF-8 bytes / ``text_bytes_per_token`` plus each image's
prompt tokens from the model's geometry. So the fitted profile's ``text_bytes_per_token`` is
measured: the runs' text bytes over the tokens the server counted beyond the images' (rows
that resend a history with replies of unknown length are left out).

Plain vLLM keeps an encoder cache beside its processor cache (``Profile.encoder_cache``): a
processor-cache hit skips preprocessing, an encoder-cache hit skips encoding. The records carry
the processor cache's hits only, so the encoder's misses are replayed here with the engine's
own encoder cache (``engine.encoder_cache``), the requests in the order their first tokens
came (lookups at schedule, entries released with the first token, as in the engine model).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..metrics import NONE
from .profile import Profile


@dataclass(frozen=True)
class TextTokens:
    """The fitted ``text_bytes_per_token`` and the requests and per-run ratios it came from."""

    bytes_per_token: float
    requests: int
    per_run: tuple[float, ...]


def run_dataset(run) -> Path | None:
    """The dataset a run read, when it is still there (as given, or beside the run)."""
    name = run.config.get("dataset") or run.config.get("input_file")
    if not name:
        return None
    for path in (Path(name), run.path / Path(name).name, run.path.parent / name):
        if path.is_file():
            return path
    return None


def run_turns(run, base: Profile) -> list | None:
    """The dataset turn of each of the run's records (text in bytes: ``text_tokens`` counted at
    one byte per token); None when the dataset is not at hand or a record is not in it."""
    from .virtual import load_turns

    dataset = run_dataset(run)
    if dataset is None:
        return None
    turns = load_turns(dataset, replace(base, text_bytes_per_token=1.0))
    # the loader numbers a session's turns in the order it sends them, which is their order in
    # the file (a single_turn row with a session_id carries no turn index of its own)
    sent: dict = {}
    by_key = {}
    for t in turns:
        sent[t.session] = sent.get(t.session, -1) + 1
        by_key[(t.session, sent[t.session])] = t
    out = []
    for cid, idx in zip(run.table.conversation_id.tolist(), run.table.turn_index.tolist()):
        turn = by_key.get((cid, idx))
        if turn is None:
            return None
        out.append(turn)
    return out


def text_tokens(runs: list, turns: list[list]) -> TextTokens | None:
    """Text bytes per server token over every request with a counted prompt, None when the runs
    carry no such request (or no text)."""
    total_bytes = total_tokens = count = 0
    per_run = []
    for run, ts in zip(runs, turns):
        b = t = 0
        for turn, n in zip(ts, run.table.input_tokens.tolist()):
            if n == NONE or turn.prior_outputs:
                continue
            text = n - sum(im.prompt_tokens for im in turn.images)
            if text > 0 and turn.text_tokens > 0:
                b, t, count = b + turn.text_tokens, t + text, count + 1
        if t:
            per_run.append(round(b / t, 4))
        total_bytes, total_tokens = total_bytes + b, total_tokens + t
    if not total_tokens or not total_bytes:
        return None
    return TextTokens(round(total_bytes / total_tokens, 4), count, tuple(per_run))


def encoder_misses(run, turns: list, base: Profile) -> tuple[np.ndarray, np.ndarray] | None:
    """Per record, the images vLLM's encoder cache did not hold and their embedding tokens
    (the base profile's encoder cache, replayed in first-token order); None when the profile
    keeps none beside the run's cache."""
    from .engine import encoder_cache

    cache = encoder_cache(base, run.target, None)
    if cache is None:
        return None
    t = run.table
    when = np.where(t.first_token_ns != NONE, t.first_token_ns, t.end_ns)
    count, tokens = np.zeros(len(turns)), np.zeros(len(turns))
    for i in np.argsort(when, kind="stable").tolist():
        images = turns[i].images
        flags = cache.lookup(i, [(im.key, im.tokens) for im in images])
        count[i] = len(flags) - sum(flags)
        tokens[i] = sum(im.tokens for im, hit in zip(images, flags) if not hit)
        cache.finish(i)
    return count, tokens
