"""Fit a simulator profile to measured runs (``mmdatagen calibrate``).

The model is the step model of :mod:`mmdatagen.sim.engine` (its ``encoder_async_fraction`` 0:
the encoder runs inside the step that admits a request), read per request. Times in ms.

* An isolated request ``i`` (nothing else in flight between its start and its first token)::

      TTFT_i = frontend_request_ms + step_base_ms + per_prefill_request_ms
               + frontend_image_ms * P_i + per_encoder_image_ms * E_i
               + per_encoder_token_ms * K_i + per_prefill_token_ms * T_i
               + per_prefill_context_ms * T_i^2 / 2000

  ``T_i`` its prompt tokens as the server counted them, ``P_i`` its images preprocessed (all of
  them, less its hits when the run's cache is looked up on arrival: vLLM's processor cache,
  whose hit skips preprocessing, not the encoder), ``E_i`` its images encoded (all of them,
  less the hits of an encoder or embedding cache; the simulator's ``image_misses`` where the
  run measured them; beside a processor cache, vLLM's encoder cache replayed from the dataset
  when the base profile keeps one, ``calibrate_terms``), ``K_i`` those images' embedding
  tokens (from the dataset; a request's images taken at their mean where only a count is
  known).
* Every request with two or more output tokens, over its decode window ``W_i`` (first token to
  last), which is ``n_i - 1`` engine steps::

      W_i = step_base_ms * (n_i - 1) + per_seq_ms * S_i + per_decode_context_ms * C_i
            + per_prefill_token_ms * T'_i + per_prefill_context_ms * Q'_i
            + per_encoder_image_ms * E'_i + per_encoder_token_ms * K'_i
            + per_prefill_request_ms * A'_i

  ``S_i`` the decoding requests summed over those steps: the decode tokens every request
  emitted during the window (``i``'s own ``n_i - 1`` included; a request overlapping it in part
  counted as emitting its tokens evenly over its own decode window), ``C_i`` the same tokens
  each weighted by its request's prompt in thousands of tokens; ``T'_i``, ``Q'_i``,
  ``E'_i``, ``K'_i`` and ``A'_i`` the prompt tokens, their attention pairs in thousands
  (``T^2 / 2000`` each), encoded images and their tokens, and the count of the requests whose
  first token falls in the window (their prefill ran in one of its steps).

* Runs at concurrency 1 whose server reported its request stages (``server_stages``), each
  run's mean frontend stage about the mean over those runs::

      F_r - mean(F) = frontend_image_ms * (P_r - mean(P))

  ``P_r`` the run's images preprocessed per request. Alone on the engine a request reaches the
  scheduler when its frontend is done, so the stage times the frontend's work on the server's
  clock; the constant (the server's part of ``frontend_request_ms``, without the client's
  HTTP part that the TTFT rows hold) is centred out. A run's mean varies by a millisecond
  where single TTFTs vary by tens: on vLLM's CPU build these rows took the standard error of
  ``frontend_image_ms`` from 4-10 ms to 0.4-2.7 ms (seven server starts).

The sets of rows go into one weighted least-squares fit (numpy): each set weighted by its own
residual spread from a first pass, the standard errors from the weighted normal matrix. A
parameter the rows cannot tell apart from the others is refused with the run that would tell
it apart, unless held at the base profile's value (``hold``; ``per_encoder_token_ms`` is held
when a run's dataset is not at hand). With the datasets, the text bytes per token are measured
too (``calibrate_terms``). Not fitted (kept from the base profile): the queueing limits
(``max_running``, ``token_budget``), the encoder cache's budget, the cache sizes; chunked
prefills (a prompt above the token budget) are taken as one step.

The engine's cost per prefilling request (``per_prefill_request_ms``, in the decode window
once per request whose first token falls in it) is a constant of every TTFT like the
frontend's; the records tell the two apart only through the windows' rough overlap rows, so it
is kept at the base profile's value unless the engine's own step lines give it
(``engine_logs``: :mod:`calibrate_steps`, which then gives every step cost it identifies, the
records fitting the rest). A step's constant (``step_base_ms``) stays with the records'
decode windows when they have any (:data:`CADENCE`): the log times a step's model execution
only, and the time between a request's tokens also holds the engine's work between steps.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..caches.targets import CacheTarget, get_target
from ..errors import SpecError, UserError
from ..metrics import NONE, RecordTable
from .calibrate_steps import STEP_PARAMS, Steps, read_steps, step_rows
from .calibrate_terms import TextTokens, run_dataset
from .profile import Profile

if TYPE_CHECKING:
    from .virtual import SimResult

PARAMS = ("frontend_request_ms", "step_base_ms", "per_seq_ms", "per_prefill_token_ms",
          "frontend_image_ms", "per_encoder_image_ms", "per_encoder_token_ms",
          "per_prefill_context_ms", "per_decode_context_ms", "per_prefill_request_ms")
TOKENS = 6  # the column of per_encoder_token_ms: needs the runs' datasets (image tokens)
CONTEXT = 7  # per_prefill_context_ms: a prompt of T tokens attends T^2 / 2 pairs
DECODE = 8  # per_decode_context_ms: each decode token attends its request's prompt
ADMIT = 9  # per_prefill_request_ms: the engine's work per prefilling request
IDENTIFIED = 0.02  # a column whose part outside the others' span is below this (relative): not identified


@dataclass
class Run:
    """One measured run as the fit reads it: its folder, settings, cache target and records
    (successful ones), with each request's preprocessed and encoded images."""

    path: Path
    config: dict
    target: CacheTarget
    table: RecordTable
    processed: np.ndarray
    encoded: np.ndarray
    hits: int
    #: embedding tokens of the images encoded (from the dataset), None when not at hand
    encoded_tokens: np.ndarray | None = None
    #: the export's ``server_stages`` means (ms per request), None when the server gave none
    stages: dict[str, float] | None = None

    @property
    def profiling(self) -> np.ndarray:
        return self.table.phase_is("profiling")


def load_run(path: Path, default_cache: str) -> Run:
    """A run folder (``records.jsonl`` and the export beside it, as bench, ab, sweep or
    simulate write them)."""
    import orjson

    from ..export import read_records
    from ..metrics import EXPORT_NAME, RECORDS_NAME

    path = Path(path)
    if not (path / RECORDS_NAME).is_file():
        raise UserError(f"{path}: no {RECORDS_NAME} (give the folder bench or simulate wrote)")
    config: dict = {}
    stages = None
    if (path / EXPORT_NAME).is_file():
        try:
            export = orjson.loads((path / EXPORT_NAME).read_bytes())
            config = export.get("input_config") or {}
            stages = (export.get("server_stages") or {}).get("avg_ms")
        except (orjson.JSONDecodeError, AttributeError):
            raise UserError(f"{path / EXPORT_NAME}: not an export") from None
    table = read_records(path / RECORDS_NAME)
    table = table.take(table.ok)
    if not len(table):
        raise UserError(f"{path}: no successful requests")
    target = get_target(str(config.get("cache") or default_cache))
    processed, encoded, hits = _image_work(path, table, target)
    return Run(path, config, target, table, processed, encoded, hits,
               stages=stages if isinstance(stages, dict) else None)


def _image_work(path: Path, t: RecordTable, target: CacheTarget
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """Per request: images preprocessed, images encoded; and the run's hits."""
    images = t.num_images.astype(float)
    hits = np.where(t.image_hits != NONE, t.image_hits, t.predicted_hits)
    if images.sum() and (hits == NONE).any():
        raise UserError(f"{path}: requests without measured or predicted cache hits (run bench "
                        "with its prediction on, or against the simulator)")
    hits = np.where(hits == NONE, 0, hits).astype(float)
    if target.lookup == "arrival":  # a processor cache: a hit skips preprocessing only
        return images - hits, images, int(hits.sum())
    encoded = np.where(t.image_misses != NONE, t.image_misses, images - hits).astype(float)
    return images, encoded, int(hits.sum())


# -- observations ---------------------------------------------------------------------------
def ttft_rows(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Design rows (columns :data:`PARAMS`) and TTFTs of the run's isolated profiling requests."""
    t = run.table
    start, first, end = t.start_ns, t.first_token_ns, t.end_ns
    # requests in flight at some point of [start_i, first_i): started before first_i, not
    # ended by start_i (each such request started before first_i)
    started = np.searchsorted(np.sort(start), first, side="left")
    ended = np.searchsorted(np.sort(end), start, side="right")
    keep = run.profiling & t.streaming & (first != NONE) & (started - ended == 1)
    n = int(keep.sum())
    x = np.zeros((n, len(PARAMS)))
    x[:, 0] = x[:, 1] = 1.0
    x[:, 3] = t.input_tokens[keep]
    x[:, CONTEXT] = t.input_tokens[keep].astype(float) ** 2 / 2000.0
    x[:, ADMIT] = 1.0
    x[:, 4] = run.processed[keep]
    x[:, 5] = run.encoded[keep]
    if run.encoded_tokens is not None:
        x[:, TOKENS] = run.encoded_tokens[keep]
    return x, (first[keep] - start[keep]) / 1e6


def window_rows(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Design rows and decode windows (ms) of the run's profiling requests with >= 2 tokens."""
    t = run.table
    first, end, out = t.first_token_ns, t.end_ns, t.output_tokens
    has = t.streaming & (first != NONE)
    f, e = first[has].astype(float), end[has].astype(float)
    keep = run.profiling & has & (out >= 2)
    fk, ek = first[keep].astype(float), end[keep].astype(float)
    steps = out[keep] - 1.0
    rate = (out[has] - 1.0) / np.maximum(e - f, 1.0)  # decode tokens per ns of each window
    decoded = _token_integral(f, e, rate, ek) - _token_integral(f, e, rate, fk)
    ctx = rate * t.input_tokens[has] / 1000.0  # decode tokens x their prompt, per ns
    attended = _token_integral(f, e, ctx, ek) - _token_integral(f, e, ctx, fk)
    order = np.argsort(f)
    fs = f[order]
    tokens = np.concatenate([[0.0], np.cumsum(t.input_tokens[has][order].astype(float))])
    pairs = np.concatenate([[0.0], np.cumsum(t.input_tokens[has][order].astype(float) ** 2
                                             / 2000.0)])
    enc = np.concatenate([[0.0], np.cumsum(run.encoded[has][order])])
    enc_tok = np.zeros(int(has.sum())) if run.encoded_tokens is None else run.encoded_tokens[has]
    enc_tok = np.concatenate([[0.0], np.cumsum(enc_tok[order])])
    lo = np.searchsorted(fs, fk, side="right")
    hi = np.searchsorted(fs, ek, side="right")
    x = np.zeros((int(keep.sum()), len(PARAMS)))
    x[:, 1] = steps
    x[:, 2] = decoded
    x[:, DECODE] = attended
    x[:, 3] = tokens[hi] - tokens[lo]
    x[:, CONTEXT] = pairs[hi] - pairs[lo]
    x[:, 5] = enc[hi] - enc[lo]
    x[:, TOKENS] = enc_tok[hi] - enc_tok[lo]
    x[:, ADMIT] = hi - lo
    return x, (ek - fk) / 1e6


def stage_rows(runs: list[Run]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the server's own frontend stage (``server_stages``) of the runs at concurrency 1,
    each about its mean over those runs: how the stage moves with the images preprocessed per
    request gives ``frontend_image_ms``. Alone on the engine a request reaches the scheduler
    as soon as its frontend is done, so the stage is the frontend's work; its constant (the
    server's, without the client's HTTP part that the TTFT rows carry) is left out by the
    centring. None of these rows (empty) unless two such runs differ in images preprocessed."""
    alone = [r for r in runs if r.stages and r.config.get("concurrency") == 1
             and not r.config.get("request_rate") and "frontend" in r.stages]
    images = np.array([float(r.processed.mean()) for r in alone])
    if len(alone) < 2 or np.ptp(images) == 0.0:
        return np.zeros((0, len(PARAMS))), np.zeros(0)
    x = np.zeros((len(alone), len(PARAMS)))
    x[:, PARAMS.index("frontend_image_ms")] = images - images.mean()
    y = np.array([float(r.stages["frontend"]) for r in alone])  # type: ignore[index]
    return x, y - y.mean()


def _token_integral(first: np.ndarray, end: np.ndarray, rate: np.ndarray, at: np.ndarray
                    ) -> np.ndarray:
    """Decode tokens emitted up to each of ``at``, every request's spread evenly over its
    window (``rate`` per ns from ``first`` to ``end``): piecewise linear between the events."""
    times = np.concatenate([first, end])
    steps = np.concatenate([rate, -rate])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(steps[order])
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
    return np.interp(at, times, area)


# -- the fit --------------------------------------------------------------------------------
@dataclass
class Fit:
    """Fitted values and standard errors (held parameters: se 0, except a cost held at 0
    after it fitted negative: ``zeroed``), each row set's spread."""

    values: dict[str, float]
    se: dict[str, float]
    held: dict[str, float]
    spread: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    #: correlation of the estimates, rows and columns in :data:`PARAMS` order (held: 0, own 1)
    correlation: list[list[float]] = field(default_factory=list)
    #: free costs fitted negative, held at 0 and the rest refitted
    zeroed: tuple[str, ...] = ()
    #: costs fitted to the engine's own step times (``--engine-log``), their se from that fit
    from_log: tuple[str, ...] = ()


def fit(runs: list[Run], hold: dict[str, float] | None = None) -> Fit:
    """Weighted least squares over every run's TTFT and decode-window rows (see the module
    docstring); refuses (``UserError``) when a free parameter is not identified."""
    hold = dict(hold or {})
    sets = {"ttft": [ttft_rows(r) for r in runs], "window": [window_rows(r) for r in runs],
            "stage": [stage_rows(runs)]}
    groups = {k: (np.vstack([x for x, _ in v]), np.concatenate([y for _, y in v]))
              for k, v in sets.items()}
    free = [i for i, p in enumerate(PARAMS) if p not in hold]
    xs, ys, names = [], [], []
    for name, (x, y) in groups.items():
        if len(y):
            xs.append(x)
            ys.append(y)
            names += [name] * len(y)
    if not xs:
        raise UserError("no request has a first token: calibrate needs streamed runs")
    x, y, label = np.vstack(xs), np.concatenate(ys), np.array(names)
    missing = [PARAMS[free[i]] for i in unidentified(x[:, free])]
    alone = len(groups["window"][1]) and np.allclose(groups["window"][0][:, 2],
                                                     groups["window"][0][:, 1])
    if missing and alone and "per_seq_ms" not in hold:
        missing = sorted({*missing, "per_seq_ms"} - {"frontend_request_ms", "step_base_ms"})
    if missing:
        raise UserError(refusal(missing, runs))
    return _nonnegative(x, y, label, hold)


def fit_steps(steps: Steps, hold: dict[str, float], token_budget: int | None = None) -> Fit:
    """The step costs the engine's log identifies, fitted to its step times (every cost >= 0);
    costs its steps never vary (no encoder step: the encoder's) are left out of ``from_log``.
    With the engine's ``token_budget``, a continued chunk's offset counts (``step_rows``)."""
    x, y, label = step_rows(steps, PARAMS, token_budget)
    own = {p: 0.0 for p in PARAMS if p not in STEP_PARAMS}
    free = [i for i, p in enumerate(PARAMS) if p not in own and p not in hold]
    blind = {PARAMS[free[i]] for i in unidentified(x[:, free])}
    result = _nonnegative(x, y, label, {**own, **{p: 0.0 for p in blind}, **hold})
    seen = tuple(p for p in STEP_PARAMS if p not in hold and p not in blind)
    return replace(result, from_log=seen)


def _nonnegative(x: np.ndarray, y: np.ndarray, label: np.ndarray, hold: dict[str, float]
                 ) -> Fit:
    """The fit with every cost >= 0: a free cost fitted negative is held at 0 and the rest
    refitted (one at a time, the most negative first), recorded in ``Fit.zeroed``. A zeroed
    cost keeps its uncertainty (:func:`_released`)."""
    zeroed: list[str] = []
    given = hold
    while True:
        free = [i for i, p in enumerate(PARAMS) if p not in hold]
        held_vec = np.array([hold.get(p, 0.0) for p in PARAMS])
        result = _solve(x[:, free], y - x @ held_vec, label, [PARAMS[i] for i in free], hold)
        negative = [p for p in PARAMS if p not in hold and result.values[p] < 0.0]
        if not negative:
            result = replace(result, zeroed=tuple(zeroed))
            return _released(x, y, label, result, given) if zeroed else result
        worst = min(negative, key=lambda p: result.values[p] / max(result.se[p], 1e-12))
        hold = {**hold, worst: 0.0}
        zeroed.append(worst)


def _released(x: np.ndarray, y: np.ndarray, label: np.ndarray, result: Fit,
              given: dict[str, float]) -> Fit:
    """``result`` (some costs zeroed) with the standard errors and correlation of every cost
    not ``given`` as held, the zeroed ones included: the least-squares curvature at the
    bounded solution with the bound released, weighted as the last pass weighted. Held at 0
    with an se of 0, a zeroed cost dropped out of every interval, although the data need not
    pin it there (of two costs that trade off, per request and per image, one fit of a real
    engine put the first at 0 and another at 11 ms). The what-if's sigma points keep it >= 0."""
    names = [p for p in PARAMS if p not in given]
    at = [PARAMS.index(p) for p in names]
    w = np.array([1.0 / result.spread[g] for g in label.tolist()])
    cov = _covariance(x[:, at] * w[:, None],
                      (y - x @ np.array([result.values[p] for p in PARAMS])) * w)
    return replace(result, se={**result.se, **_std_errors(cov, names)},
                   correlation=_correlation(cov, names))


def _covariance(xw: np.ndarray, resid_w: np.ndarray) -> np.ndarray:
    """The weighted least-squares covariance of the costs (columns of ``xw``): the inverse
    curvature scaled by the weighted residual variance per degree of freedom (at least 1)."""
    dof = max(len(resid_w) - xw.shape[1], 1)
    return np.linalg.pinv(xw.T @ xw) * max(float(resid_w @ resid_w) / dof, 1.0)


def _std_errors(cov: np.ndarray, names: list[str]) -> dict[str, float]:
    return {n: math.sqrt(max(float(cov[i, i]), 0.0)) for i, n in enumerate(names)}


def _solve(x: np.ndarray, y: np.ndarray, label: np.ndarray, names: list[str],
           hold: dict[str, float]) -> Fit:
    """Two passes: scaled by each set's typical size, then by each set's residual spread."""
    w = np.ones(len(y))
    for g in set(label.tolist()):
        w[label == g] = 1.0 / max(float(np.median(np.abs(y[label == g]))), 1e-9)
    spread: dict[str, float] = {}
    for _ in range(2):
        beta, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
        resid = y - x @ beta
        for g in set(label.tolist()):
            sel = label == g
            dof = max(int(sel.sum()) - 1, 1)
            rms = math.sqrt(float(resid[sel] @ resid[sel]) / dof)
            floor = 1e-6 * max(float(np.median(np.abs(y[sel]))), 1e-9)
            spread[g] = max(rms, floor)
            w[sel] = 1.0 / spread[g]
    cov = _covariance(x * w[:, None], (y - x @ beta) * w)
    values = {**hold, **{n: float(b) for n, b in zip(names, beta)}}
    se = {**{n: 0.0 for n in hold}, **_std_errors(cov, names)}
    rows = {g: int((label == g).sum()) for g in sorted(set(label.tolist()))}
    return Fit({p: values[p] for p in PARAMS}, {p: se[p] for p in PARAMS}, hold, spread, rows,
               _correlation(cov, names))


def _correlation(cov: np.ndarray, names: list[str]) -> list[list[float]]:
    """The estimates' correlation matrix over :data:`PARAMS` (a held parameter: row of 0)."""
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    full = np.zeros((len(PARAMS), len(PARAMS)))
    at = [PARAMS.index(n) for n in names]
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = np.where(np.outer(sd, sd) > 0, cov / np.outer(sd, sd), 0.0)
    full[np.ix_(at, at)] = np.clip(corr, -1.0, 1.0)
    for i in at:
        full[i, i] = 1.0
    return [[round(float(v), 6) for v in row] for row in full]


def unidentified(x: np.ndarray) -> list[int]:
    """Columns of ``x`` (each scaled to unit norm) whose part outside the span of the other
    columns is below :data:`IDENTIFIED`: the data cannot tell them from the rest."""
    norms = np.linalg.norm(x, axis=0)
    zero = [i for i, n in enumerate(norms) if n == 0.0]
    xs = x / np.where(norms > 0, norms, 1.0)
    out = list(zero)
    for i in range(x.shape[1]):
        others = np.delete(xs, zero + [i], axis=1)
        if i in zero or others.shape[1] == 0:
            continue
        coef, *_ = np.linalg.lstsq(others, xs[:, i], rcond=None)
        if np.linalg.norm(xs[:, i] - others @ coef) < IDENTIFIED:
            out.append(i)
    return sorted(out)


def refusal(params: list[str], runs: list[Run]) -> str:
    """One line: which parameters the runs cannot identify and what run to add for each."""
    return ("cannot identify " + "; ".join(f"{p} ({_advice(p, runs)})" for p in params)
            + " (or --hold them at the base profile's values)")


def _advice(param: str, runs: list[Run]) -> str:
    arrival = [r.target.lookup == "arrival" for r in runs]
    saved = "frontend_image_ms" if any(arrival) else "per_encoder_image_ms"
    if param == saved:
        hits = sum(r.hits for r in runs)
        images = sum(int(r.table.num_images[r.profiling].sum()) for r in runs)
        if hits == 0:
            return "no cache hits at all: add a run whose images repeat, with the cache on"
        if hits >= images:
            return "every image hit: add a run with the cache off (--cache-size 0)"
    return {
        "frontend_request_ms": "the TTFT's constant is not told from the other costs listed: "
                               "add the runs they name, or streamed runs with >= 2 output "
                               "tokens",
        "step_base_ms": "add streamed runs with >= 2 output tokens per request",
        "per_seq_ms": "every request ran alone, so the decode step's cost per running "
                      "request is not told from its base: add a run at concurrency 2 or more",
        "per_prefill_token_ms": "add a run with other prompt lengths (another --text-tokens)",
        "per_decode_context_ms": "add a run with other prompt lengths (another --text-tokens) "
                                 "and streamed replies of >= 2 tokens",
        "per_prefill_request_ms": "a request's fixed cost is told apart as the engine's (not "
                                  "the frontend's) only when other requests start while it "
                                  "decodes: add a run at concurrency 2 or more",
        "per_prefill_context_ms": "attention's part that grows with the prompt is told apart "
                                  "only by three or more prompt lengths: add a run with "
                                  "another --text-tokens",
        "frontend_image_ms": "add a run with another --images-per-request",
        "per_encoder_image_ms": "add a run with another --images-per-request",
        "per_encoder_token_ms": "every encoded image has one size, so the encoder's cost per "
                                "image token is not told from its cost per image: add a run "
                                "with another --image-size",
    }[param]


# -- the profile ----------------------------------------------------------------------------
def fitted_profile(base: Profile, result: Fit, runs: list[Run], name: str,
                   tokens: TextTokens | None = None) -> Profile:
    """The base profile with the fitted costs (negative fits written as 0), the encoder in the
    step, the runs' cache target when they share one, the measured text bytes per token
    (``tokens``) and the fit in ``calibration``."""
    targets = {r.target.name for r in runs}
    values = {p: max(0.0, round(v, 6)) for p, v in result.values.items()}
    changes: dict[str, Any] = dict(values, name=name, encoder_async_fraction=0.0,
                                   description=f"calibrated by mmdatagen calibrate from "
                                               f"{len(runs)} runs (base {base.name})")
    if len(targets) == 1:
        changes.update(cache=targets.pop(), key_mode=None, register=None)
    if tokens is not None:
        changes["text_bytes_per_token"] = tokens.bytes_per_token
    calibration = {"base_profile": base.name, "runs": [str(r.path) for r in runs],
                   "held": sorted(result.held), "zeroed": list(result.zeroed),
                   "from_engine_log": list(result.from_log),
                   "rows": result.rows,
                   "parameters": {p: {"value": result.values[p], "se": result.se[p]}
                                  for p in PARAMS},
                   "correlation": result.correlation}
    if tokens is not None:
        calibration["text_bytes_per_token"] = {"value": tokens.bytes_per_token,
                                               "requests": tokens.requests,
                                               "per_run": list(tokens.per_run)}
    return replace(base, calibration=calibration, **changes).validate()


def profile_yaml(prof: Profile) -> str:
    """The profile as a YAML file ``load_profile`` reads back."""
    import yaml

    data = asdict(prof)
    data["default_image_size"] = list(prof.default_image_size)
    data = {k: v for k, v in data.items() if v is not None}
    head = ("# Fitted by `mmdatagen calibrate` (a fit of mmdatagen's step model to the runs "
            "below,\n# not a measurement of the hardware): calibration.parameters holds each "
            "value and its\n# standard error.\n")
    return head + yaml.safe_dump(data, sort_keys=False)


def write_profile(path: Path, prof: Profile) -> None:
    from ..io.atomic import atomic_write_bytes

    atomic_write_bytes(Path(path), profile_yaml(prof).encode())


# -- prediction -----------------------------------------------------------------------------
def measured(run: Run) -> dict[str, float | None]:
    """The run's TTFT p50 (ms) and request throughput (req/s), from its records."""
    from ..export import build_export

    return _headline(build_export(run.table, input_config={}))


def _headline(export: dict) -> dict[str, float | None]:
    return {"ttft_p50": (export.get("time_to_first_token") or {}).get("p50"),
            "throughput": (export.get("request_throughput") or {}).get("avg")}


def predict(run: Run, prof: Profile) -> dict[str, float | None] | None:
    """The run's TTFT p50 and throughput replayed with ``prof`` (:func:`replay`); None without
    its dataset."""
    return _replayed(replay(run, prof))


def _replayed(res: SimResult | None) -> dict[str, float | None] | None:
    """A replay's TTFT p50 and throughput (None: no replay)."""
    from ..export import build_export

    return None if res is None else _headline(build_export(res.records, input_config={}))


def replay(run: Run, prof: Profile) -> SimResult | None:
    """The run replayed in virtual time with ``prof`` (its dataset, concurrency or rate,
    request counts, output settings, cache target and size); None without its dataset."""
    from ..scheduling import slots_for
    from .study import output_policy
    from .virtual import run_simulation

    dataset = run_dataset(run)
    if dataset is None:
        return None
    c = run.config
    prof = prof.for_cache(run.target.name)
    size = c.get("cache_size", c.get("cache_gb"))
    return run_simulation(dataset, prof, prof.cache_target().resolve(size),
                          slots_for(c.get("concurrency"), c.get("request_rate")),
                          c.get("request_count"), int(c.get("warmup_request_count") or 0),
                          output_policy(c.get("extra_inputs") or {}),
                          bool(c.get("streaming", True)), c.get("request_rate"),
                          c.get("arrival") or "poisson", int(c.get("seed") or 0))


def predict_interval(run: Run, prof: Profile, centre: dict[str, float | None]
                     ) -> dict[str, list[float]] | None:
    """±1 sigma of ``centre`` (``predict(run, prof)``) from the fit's uncertainty: the run
    replayed at the sigma points of the costs' covariance (:mod:`whatif`); None without a
    calibration's uncertainty or the run's dataset."""
    from .whatif import interval_rows, sigma_points

    moved: list[tuple[list[dict], list[dict]]] = []
    for hi, lo in sigma_points(prof):
        up, down = predict(run, hi), predict(run, lo)
        if up is None or down is None:
            return None
        moved.append(([up], [down]))
    if not moved:
        return None
    band: dict[str, list[float]] = interval_rows([dict(centre)], moved, tuple(centre))[0]["interval"]
    return band


# -- the command's call ---------------------------------------------------------------------
@dataclass
class Calibration:
    profile: Profile
    fit: Fit
    runs: list[Run]
    base: Profile
    residuals: list[dict[str, Any]] = field(default_factory=list)
    tokens: TextTokens | None = None
    #: the engine log's step fit (``--engine-log``) and its step count, None without a log
    steps: Fit | None = None
    step_count: int = 0


def base_for(runs_config: list[dict], name: str | None) -> Profile:
    """``name``, else the profile the runs name when they agree, else the default."""
    from .profile import load_profile

    if name is not None:
        return load_profile(name)
    named = {str(c.get("profile")) for c in runs_config if c.get("profile")}
    if len(named) == 1:
        try:
            return load_profile(named.pop())
        except UserError:  # a profile file the runs named by its stem only
            pass
    return load_profile("qwen3-vl-30b-gb200")


def calibrate(paths: list[Path], output: Path, base_profile: str | None = None,
              hold: list[str] | None = None, holdout: list[Path] | None = None,
              engine_logs: list[Path] | None = None) -> Calibration:
    """Read the runs, fit, build the profile (named after ``output``) and replay every run
    with it (the residuals), and the ``holdout`` runs (not fitted); writes nothing. With
    ``engine_logs`` the step costs are fitted to the engine's own step times first
    (:mod:`calibrate_steps`) and the runs' records fit the rest."""
    unknown = sorted(set(hold or ()) - set(PARAMS))
    if unknown:
        raise SpecError("hold", f"names unknown parameters {', '.join(unknown)} (of "
                                f"{', '.join(PARAMS)})")
    if not paths:
        raise UserError("give one or more run folders")
    first = [load_run(p, "dynamo-embedding") for p in paths[:1]]
    base = base_for([first[0].config], base_profile)
    runs = first + [load_run(p, base.cache) for p in paths[1:]]
    base = base_for([r.config for r in runs], base_profile)
    runs, tokens = dataset_terms(runs, base)
    hold = list(hold or ())
    if any(r.encoded_tokens is None for r in runs) and PARAMS[TOKENS] not in hold:
        hold.append(PARAMS[TOKENS])  # no dataset to count the encoded images' tokens
    windows = any(len(window_rows(r)[1]) for r in runs)
    held, steps, count = _log_fit(engine_logs, base,
                                  {p: float(getattr(base, p)) for p in hold}, windows)
    result = _with_log(fit(runs, held), steps)
    prof = fitted_profile(base, result, runs, Path(output).stem, tokens)
    held_out = [load_run(p, base.cache) for p in holdout or ()]
    residuals = [_residual(r, prof, fitted=i < len(runs))
                 for i, r in enumerate([*runs, *held_out])]
    return Calibration(prof, result, runs, base, residuals, tokens, steps, count)


def _residual(run: Run, prof: Profile, fitted: bool) -> dict[str, Any]:
    """The run measured and replayed with ``prof``; a held-out run's prediction with its
    interval (``predict_interval``); the server's stages measured and replayed."""
    res = replay(run, prof)
    predicted = _replayed(res)
    interval = (predict_interval(run, prof, predicted) if predicted is not None and not fitted
                else None)
    replayed = None if res is None or res.engine is None else res.engine.stages().get("avg_ms")
    return {"run": str(run.path), "hits": run.hits, "measured": measured(run),
            "predicted": predicted, "fitted": fitted, "interval": interval,
            "stages": {"measured": run.stages, "replayed": replayed}}


#: the step cost the records' decode windows give even beside an engine log: a step's constant.
#: vLLM times a step from the dispatch of its model execution to the result
#: (``EngineCore.step``); its scheduling and its output's handling and sending between steps
#: are outside that timer, and every token waits for them (on vLLM's CPU build: 0.16-0.56 ms a
#: step over seven server starts). Held at the log's value, the replayed time between a
#: request's tokens came out 16 % off on average (-30 to +16 %) over the calibration runs of
#: four of those starts, 17 % on their held-out runs; fitted from the windows, 10 % and 13 %.
CADENCE = "step_base_ms"


def _log_fit(engine_logs: list[Path] | None, base: Profile, hold: dict[str, float],
             windows: bool = False) -> tuple[dict[str, float], Fit | None, int]:
    """What the records' fit holds (``hold`` and the step costs from the engine's logs), the
    logs' fit (None without) and the steps read. With decode ``windows`` in the records, a
    step's constant (:data:`CADENCE`) is left to them."""
    held, steps, count = dict(hold), None, 0
    if engine_logs:
        log = read_steps(list(engine_logs))
        steps, count = fit_steps(log, hold, base.token_budget), len(log)
        if windows and CADENCE in steps.from_log:
            steps = replace(steps, from_log=tuple(p for p in steps.from_log if p != CADENCE))
        held.update({p: steps.values[p] for p in steps.from_log})
        if "per_seq_ms" in steps.from_log:  # its decode steps carry their prompts' cost
            held.setdefault(PARAMS[DECODE], float(getattr(base, PARAMS[DECODE])))
    # from the engine's step lines, or kept at the base's value (the module docstring)
    held.setdefault(PARAMS[ADMIT], float(getattr(base, PARAMS[ADMIT])))
    return held, steps, count


def _with_log(result: Fit, steps: Fit | None) -> Fit:
    """The records' fit with the log's costs marked as fitted there, with their se and their
    correlation from the log's fit (the records held them: rows of 0 there, which dropped
    their uncertainty from every interval). The two fits read different data: no
    correlation across them."""
    if steps is None:
        return result
    corr = np.array(result.correlation, dtype=float).reshape(len(PARAMS), len(PARAMS))
    at = [PARAMS.index(p) for p in steps.from_log]
    corr[np.ix_(at, at)] = np.asarray(steps.correlation, dtype=float)[np.ix_(at, at)]
    return replace(result, held={p: v for p, v in result.held.items()
                                 if p not in steps.from_log},
                   se={**result.se, **{p: steps.se[p] for p in steps.from_log}},
                   correlation=corr.tolist(), from_log=steps.from_log)


def dataset_terms(runs: list[Run], base: Profile) -> tuple[list[Run], TextTokens | None]:
    """The runs with the images vLLM's encoder cache spared the encoder (a base profile that
    keeps it: ``calibrate_terms.encoder_misses``), and the text tokens per byte, from the runs'
    datasets; without the datasets, the runs as read and None."""
    from .calibrate_terms import encoder_misses, run_turns, text_tokens

    found = [run_turns(r, base) for r in runs]
    lost = [str(r.path) for r, t in zip(runs, found) if t is None]
    if lost and base.encoder_cache and any(r.target.lookup == "arrival" for r in runs):
        raise UserError(f"{lost[0]}: its dataset is not at hand (as the export names it, or "
                        "beside the run), and the base profile keeps vLLM's encoder cache, "
                        "whose hits calibrate replays from it")
    turns = [t for t in found if t is not None]
    if lost:
        return runs, None
    out = []
    for r, ts in zip(runs, turns):
        enc = encoder_misses(r, ts, base)
        if enc is None:  # the run's own count; its images' mean tokens each
            mean = np.array([np.mean([im.tokens for im in t.images]) if t.images else 0.0
                             for t in ts])
            out.append(replace(r, encoded_tokens=r.encoded * mean))
        else:
            out.append(replace(r, encoded=enc[0], encoded_tokens=enc[1]))
    return out, text_tokens(runs, turns)


def report_lines(cal: Calibration) -> list[str]:
    """The parameters (fitted, standard error, base value) and the per-run residuals."""
    f = cal.fit
    lines = [f"base profile {cal.base.name}; {len(cal.runs)} runs",
             f"{'parameter':22} {'fitted':>10} {'± se':>9} {'base':>10}"]
    for p in PARAMS:
        se = (f"{f.se[p]:.3g} at 0" if p in f.zeroed else "held" if p in f.held
              else f"{f.se[p]:.4g} log" if p in f.from_log else f"{f.se[p]:.4g}")
        lines.append(f"{p:22} {f.values[p]:10.4f} {se:>9} {float(getattr(cal.base, p)):10.4f}")
    if cal.tokens is not None:
        t = cal.tokens
        lines.append(f"text_bytes_per_token  {t.bytes_per_token:10.4f} (measured over "
                     f"{t.requests} requests; per run "
                     f"{', '.join(f'{v:g}' for v in t.per_run)}; base "
                     f"{cal.base.text_bytes_per_token:g})")
    lines.append("rows: " + ", ".join(f"{k} {v} (spread {f.spread.get(k, 0):.3g} ms)"
                                      for k, v in f.rows.items()))
    if cal.steps is not None:
        s = cal.steps
        lines.append(f"engine log: {cal.step_count} steps fitted the costs marked log ("
                     + ", ".join(f"{k} {v} (spread {s.spread.get(k, 0):.3g} ms)"
                                 for k, v in s.rows.items()) + ")")
        if CADENCE not in s.from_log and CADENCE not in f.held:
            own, fitted = s.values[CADENCE], f.values[CADENCE]
            lines.append(f"{CADENCE} from the decode windows: {fitted:.4g} ms, the log's steps "
                         f"alone {own:.4g} ms ({fitted - own:+.3g} ms a step: the engine's work "
                         "between the steps its timer covers)")
    lines.append(f"{'run':32} {'hits':>6} {'TTFT p50 meas':>13} {'pred':>9} {'err':>7} "
                 f"{'req/s meas':>10} {'pred':>9} {'err':>7}")
    for i, row in enumerate(cal.residuals):
        if i == len(cal.runs):  # the fitted runs come first, then the held-out ones
            lines.append("held out (not fitted; ± the prediction's 1 sigma from the fit's "
                         "uncertainty, TTFT ms and req/s):")
        lines.append(_residual_line(row))
    if any(row["predicted"] is None for row in cal.residuals):
        lines.append("(pred -: the run's dataset is not at hand to replay it)")
    return lines + _stage_lines(cal.residuals)


def _stage_lines(residuals: list[dict[str, Any]]) -> list[str]:
    """Per run whose server reported its request stages (``server_stages``): each stage's mean
    ms measured against replayed, where the model's time goes wrong (not fitted)."""
    from ..metrics import STAGES

    rows = [r for r in residuals if r["stages"]["measured"] and r["stages"]["replayed"]]
    if not rows:
        return []
    lines = ["where a request's time goes on the server, mean ms measured / replayed "
             "(the server's /metrics, warmup included; not fitted):",
             f"{'run':32} " + " ".join(f"{k:>15}" for k in STAGES)]
    for r in rows:
        m, p = r["stages"]["measured"], r["stages"]["replayed"]
        lines.append(f"{_short(r['run']):32} "
                     + " ".join(f"{_num(m.get(k)):>7}/{_num(p.get(k)):<7}" for k in STAGES))
    return lines


def _residual_line(row: dict[str, Any]) -> str:
    """One run's line: measured, predicted and the error of TTFT p50 and throughput (and a
    held-out run's 1 sigma)."""
    meas, pred = row["measured"], row["predicted"] or {}
    cells = []
    for key in ("ttft_p50", "throughput"):
        mv, pv = meas.get(key), pred.get(key)
        err = f"{(pv / mv - 1) * 100:+6.1f}%" if mv and pv is not None else "-"
        cells.append(f"{_num(mv):>9} {_num(pv):>9} {err:>7}")
    band = row.get("interval") or {}
    sigma = "".join(f" ±{(band[k][1] - band[k][0]) / 2:.3g}"
                    for k in ("ttft_p50", "throughput") if k in band)
    return f"{_short(row['run']):32} {row['hits']:6d}     {cells[0]}  {cells[1]}{sigma}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _short(path: str) -> str:
    return path if len(path) <= 32 else "..." + path[-29:]
