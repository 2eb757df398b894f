"""The spec of ``calibrate``: the fitted profile's file, its base, the parameters held."""
from __future__ import annotations

from dataclasses import dataclass

from . import common
from .base import list_option, option, spec


@spec
@dataclass(frozen=True)
class CalibrateOutput:
    """Where the fitted profile goes and what it starts from (the runs are the arguments)."""

    output: str = option(None, "--output", "The fitted profile (YAML), usable with --profile "
                         "by serve, simulate, ab and sweep.", short="-o", dir_okay=False,
                         required=True)
    base_profile: str | None = option(None, "--base-profile", "Profile whose other fields "
                                      "(model, max_running, token_budget, cache...) the fit "
                                      "keeps. Default: the runs' profile, else "
                                      "qwen3-vl-30b-gb200.")
    hold: tuple[str, ...] = list_option("--hold", "Parameters kept at the base profile's value "
                                        "instead of fitted (a list: per_seq_ms,...).",
                                        metavar="NAMES")
    holdout: tuple[str, ...] = list_option("--holdout", "Run folders NOT fitted: replayed "
                                           "with the fitted profile and shown apart, measured "
                                           "against predicted (a list).", metavar="DIRS")
    engine_log: tuple[str, ...] = list_option(
        "--engine-log", "vLLM logs with its step lines (the server started with "
        "--enable-logging-iteration-details): the step costs are fitted to the engine's own "
        "step times, the runs' records fit the rest (a list).", metavar="FILES")
    quiet: bool = common.quiet("No table.")
    force: bool = common.force()
