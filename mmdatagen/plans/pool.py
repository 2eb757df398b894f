"""Pool workload: independent single-turn rows drawing images from a pool with controlled reuse."""
from __future__ import annotations

import numpy as np

from .. import rng
from ..errors import SpecError, UserError
from .base import Plan, require_positive
from .media import DEFAULT_VIDEO_SIZE, MediaPlan, check_counts, video_media
from .sizes import assign_sizes, parse_sizes

REUSE_PATTERNS = ("first-pass-unique", "uniform", "zipf", "cyclic")


def pool_size_for_reuse(num_requests: int, images_per_request: int, reuse: float) -> int:
    """Pool size whose first-pass-unique plan reaches a best-possible hit rate of ``reuse``."""
    if not 0.0 <= reuse < 1.0:
        raise SpecError("target_reuse", f"must be in [0, 1), got {reuse}")
    refs = num_requests * images_per_request
    return max(images_per_request, round(refs * (1.0 - reuse)))


#: Rejection rounds before the draw switches to the exact conditional distribution (weights of
#: the ids already in the row set to zero): the same distribution, and a bounded loop even when
#: a steep Zipf puts almost all the weight on a few ids.
REJECTION_ROUNDS = 16


def _distinct_draws(gen: np.random.Generator, n: int, k: int, p: np.ndarray | None,
                    forced: list[int]) -> list[int]:
    """k distinct ids: ``forced`` first, the rest drawn from n (weights p) excluding repeats."""
    row = list(forced)
    for _ in range(REJECTION_ROUNDS):
        if len(row) >= k:
            return row
        need = k - len(row)
        for c in gen.choice(n, size=need * 2 + 2, p=p).tolist():
            if c not in row:
                row.append(c)
                if len(row) == k:
                    break
    while len(row) < k:  # at most k rounds: each adds one id of positive remaining weight
        q = np.ones(n) if p is None else p.copy()
        q[row] = 0.0
        if q.sum() <= 0.0:  # weights underflowed to zero: the rest uniformly
            q = np.ones(n)
            q[row] = 0.0
        row.append(int(gen.choice(n, p=q / q.sum())))
    return row


def _first_pass_unique(gen: np.random.Generator, rows: int, n: int, k: int) -> np.ndarray:
    """The seeds' rule: the first n slots deal a shuffled pool once, then uniform with replacement."""
    total = rows * k
    dealt = gen.permutation(n)[: min(n, total)]
    out = np.empty((rows, k), np.int64)
    full_rows = len(dealt) // k
    out[:full_rows] = dealt[: full_rows * k].reshape(full_rows, k)
    rest = dealt[full_rows * k:].tolist()
    if k == 1:
        out[full_rows:, 0] = gen.integers(0, n, size=rows - full_rows)
        return out
    for r in range(full_rows, rows):
        out[r] = _distinct_draws(gen, n, k, None, rest if r == full_rows else [])
    return out


def pool_ids(gen: np.random.Generator, rows: int, n: int, k: int, reuse: str,
             zipf_exponent: float) -> np.ndarray:
    """``rows`` x ``k`` ids drawn from a pool of ``n`` by one reuse pattern (see REUSE_PATTERNS)."""
    if k == 0:
        return np.empty((rows, 0), np.int64)
    if reuse == "first-pass-unique":
        return _first_pass_unique(gen, rows, n, k)
    if reuse == "cyclic":
        return (np.arange(rows * k, dtype=np.int64) % n).reshape(rows, k)
    p = None
    if reuse == "zipf":
        p = 1.0 / np.arange(1, n + 1, dtype=float) ** zipf_exponent
        p /= p.sum()
    if k == 1:
        return gen.choice(n, size=(rows, 1), p=p).astype(np.int64)
    return np.array([_distinct_draws(gen, n, k, p, []) for _ in range(rows)], np.int64)


def _check_pool(name: str, per_request: int, pool_size: int | None) -> None:
    field = f"{name.replace('-', '_')}pool_size"
    if per_request and (pool_size is None or pool_size <= 0):
        raise SpecError(field, f"must be a positive integer, got {pool_size}")
    if per_request > (pool_size or 0):
        what, item = (name.rstrip("-") + "s", name.rstrip("-")) if name else ("images", "image")
        raise SpecError(f"{what}_per_request", f"({per_request}) exceeds the {item} pool size "
                        f"({pool_size}); a row never repeats an {item}")


def _pool_sizes(num_requests: int, per_request: dict[str, int], target_reuse: float | None,
                given: dict[str, int | None]) -> dict[str, int]:
    """Pool size per modality ("" for images): as given, derived from ``target_reuse``, and
    videos' and audios' defaulting to the image pool's."""
    sizes = dict(given)
    if target_reuse is not None:
        sizes[""] = pool_size_for_reuse(num_requests, max(1, per_request[""]), target_reuse)
        for m in ("video", "audio"):
            if per_request[m] and sizes[m] is None:
                sizes[m] = pool_size_for_reuse(num_requests, per_request[m], target_reuse)
    images = sizes[""]
    if images is None:
        raise SpecError("pool_size", "is required when no target reuse is given")
    return {m: images if size is None else size for m, size in sizes.items()}


def pool_plan(num_requests: int = 1000, pool_size: int | None = 200, images_per_request: int = 1,
              reuse: str = "first-pass-unique", zipf_exponent: float = 1.0,
              target_reuse: float | None = None, image_size: str | list = "640x480",
              seed: int = 0, videos_per_request: int = 0, audios_per_request: int = 0,
              video_pool_size: int | None = None, audio_pool_size: int | None = None,
              video_size: str | list = DEFAULT_VIDEO_SIZE) -> Plan:
    """Build the pool plan (see REUSE_PATTERNS); ``target_reuse`` derives the pool size.

    Videos and audios draw from their own pools (default: ``pool_size`` items each) with the
    same reuse pattern and their own random streams.
    """
    check_counts(images_per_request=images_per_request, videos_per_request=videos_per_request,
                 audios_per_request=audios_per_request)
    per_request = {"": images_per_request, "video": videos_per_request,
                   "audio": audios_per_request}
    pools = _pool_sizes(num_requests, per_request, target_reuse,
                        {"": pool_size, "video": video_pool_size, "audio": audio_pool_size})
    require_positive(num_requests=num_requests, pool_size=pools[""])
    for name, k in per_request.items():
        _check_pool(name + "-" if name else "", k, pools[name])
    if reuse not in REUSE_PATTERNS:
        raise UserError(f"unknown reuse pattern {reuse!r}; choose from {', '.join(REUSE_PATTERNS)}")
    if reuse == "zipf" and not 0 < zipf_exponent < float("inf"):
        raise SpecError("zipf_exponent", "must be a positive finite number")
    n, k, rows = pools[""], images_per_request, num_requests
    ids = pool_ids(rng.rng_for(seed, rng.PLAN), rows, n, k, reuse, zipf_exponent)
    widths, heights = assign_sizes(n if k else 0, parse_sizes(image_size), seed)
    params = dict(num_requests=rows, pool_size=n, images_per_request=k, reuse=reuse,
                  zipf_exponent=zipf_exponent if reuse == "zipf" else None, seed=seed)
    media: dict[str, MediaPlan] = {}
    if videos_per_request:
        vids = pool_ids(rng.rng_for(seed, rng.VIDEO_PLAN), rows, pools["video"],
                        videos_per_request, reuse, zipf_exponent)
        media["video"] = video_media(vids, pools["video"], video_size, seed)
        params.update(videos_per_request=videos_per_request, video_pool_size=pools["video"])
    if audios_per_request:
        auds = pool_ids(rng.rng_for(seed, rng.AUDIO_PLAN), rows, pools["audio"],
                        audios_per_request, reuse, zipf_exponent)
        media["audio"] = MediaPlan("audio", auds, pools["audio"])
        params.update(audios_per_request=audios_per_request, audio_pool_size=pools["audio"])
    return Plan(kind="pool", image_ids=ids, widths=widths, heights=heights,
                text_keys=np.arange(rows, dtype=np.int64), params=params, media=media)
