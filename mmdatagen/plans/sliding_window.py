"""Sliding-window workload: per-user sessions whose consecutive turns share images."""
from __future__ import annotations

import numpy as np

from .. import rng
from ..errors import SpecError, UserError
from .base import Plan, require_positive
from .media import DEFAULT_VIDEO_SIZE, MediaPlan, check_counts, video_media
from .sizes import assign_sizes, parse_sizes

ORDERS = ("turn-major", "user-major", "random")
TEXT_SHARING = ("row", "user", "all")


def window_ids(users: int, turns: int, window: int, stride: int, shared: int
               ) -> tuple[np.ndarray, int]:
    """Item ids per (user, turn) row in canonical order (user-major) and the number of items.

    User u, turn t shows ``u*P + t*s ... u*P + t*s + W' - 1`` (W' = window - shared private
    slots, P = W' + (T-1)s), then ``shared`` slots of one window common to all users.
    """
    private = window - shared
    per_user = private + (turns - 1) * stride if private else 0
    shared_base = users * per_user
    num_items = shared_base + (shared + (turns - 1) * stride if shared else 0)
    user = np.repeat(np.arange(users), turns)
    turn = np.tile(np.arange(turns), users)
    slots = np.arange(window)
    priv_ids = user[:, None] * per_user + turn[:, None] * stride + slots[None, :private]
    shared_ids = shared_base + turn[:, None] * stride + slots[None, :shared]
    return np.concatenate([priv_ids, shared_ids], axis=1).astype(np.int64), num_items


def sliding_window_plan(users: int = 30, turns: int = 8, window: int = 5, stride: int = 1,
                        order: str = "turn-major", shared_fraction: float = 0.0,
                        text_sharing: str = "row", image_size: str | list = "2400x1080",
                        seed: int = 0, videos_per_request: int = 0, audios_per_request: int = 0,
                        video_size: str | list = DEFAULT_VIDEO_SIZE) -> Plan:
    """User u, turn t shows images ``u*P + t*s ... u*P + t*s + W - 1`` with P = W + (T-1)s.

    ``shared_fraction`` turns round(f*W) slots of every window into a window over one sequence
    common to all users (same stride), so users share those images turn by turn. Videos and
    audios slide the same way over their own per-user sequences (windows of
    ``videos_per_request`` / ``audios_per_request`` items, same stride and shared fraction).
    """
    require_positive(users=users, turns=turns)
    check_counts(window=window, videos_per_request=videos_per_request,
                 audios_per_request=audios_per_request)
    if stride < 0:
        raise SpecError("stride", f"must be zero or positive, got {stride}")
    if order not in ORDERS:
        raise UserError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")
    if text_sharing not in TEXT_SHARING:
        raise UserError(f"unknown text sharing {text_sharing!r}; choose from {', '.join(TEXT_SHARING)}")
    if not 0.0 <= shared_fraction <= 1.0:
        raise SpecError("shared_fraction", f"must be in [0, 1], got {shared_fraction}")
    ids, num_images = window_ids(users, turns, window, stride, round(shared_fraction * window))

    user = np.repeat(np.arange(users), turns)          # canonical (user, turn) order
    turn = np.tile(np.arange(turns), users)
    if order == "turn-major":
        perm = np.lexsort((user, turn))
    elif order == "user-major":
        perm = np.arange(users * turns)
    else:  # seeded interleave; the k-th appearance of a user is its turn k
        labels = rng.rng_for(seed, rng.ORDER).permutation(user)
        seen = np.zeros(users, np.int64)
        perm = np.empty(users * turns, np.int64)
        for i, u in enumerate(labels.tolist()):
            perm[i] = u * turns + seen[u]
            seen[u] += 1
    text_keys = {"row": user * turns + turn, "user": user, "all": np.zeros_like(user)}[text_sharing]
    widths, heights = assign_sizes(num_images, parse_sizes(image_size), seed)
    params = dict(users=users, turns=turns, window=window, stride=stride, order=order,
                  shared_fraction=shared_fraction, text_sharing=text_sharing, seed=seed)
    media = {}
    if videos_per_request:
        vids, n = window_ids(users, turns, videos_per_request, stride,
                             round(shared_fraction * videos_per_request))
        media["video"] = video_media(vids[perm], n, video_size, seed)
        params["videos_per_request"] = videos_per_request
    if audios_per_request:
        auds, n = window_ids(users, turns, audios_per_request, stride,
                             round(shared_fraction * audios_per_request))
        media["audio"] = MediaPlan("audio", auds[perm], n)
        params["audios_per_request"] = audios_per_request
    return Plan(kind="sliding-window", image_ids=ids[perm], widths=widths, heights=heights,
                text_keys=text_keys[perm].astype(np.int64), sessions=user[perm].astype(np.int64),
                turns=turn[perm].astype(np.int64), params=params, media=media)
