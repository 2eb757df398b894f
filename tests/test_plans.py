"""Plans: which image each row shows, as pure data."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.errors import UserError
from mmdatagen.plans import pool_plan, shard_range, sliding_window_plan
from mmdatagen.plans.pool import pool_size_for_reuse
from mmdatagen.plans.sizes import parse_sizes


def test_pool_reference_first_pass_unique():
    plan = pool_plan()
    ids = plan.trace()
    assert plan.num_rows == 1000 and plan.images_per_row == 1 and plan.num_images == 200
    assert len(set(ids[:200].tolist())) == 200
    assert set(ids[200:].tolist()) <= set(ids[:200].tolist())
    assert 1 - len(np.unique(ids)) / len(ids) == pytest.approx(0.8)


@pytest.mark.parametrize("reuse", ["first-pass-unique", "uniform", "zipf", "cyclic"])
def test_pool_rows_never_repeat_an_image(reuse):
    plan = pool_plan(num_requests=300, pool_size=20, images_per_request=4, reuse=reuse, seed=3)
    assert plan.image_ids.shape == (300, 4)
    assert all(len(set(row.tolist())) == 4 for row in plan.image_ids)
    assert plan.image_ids.min() >= 0 and plan.image_ids.max() < 20


def test_first_pass_unique_multi_image_shows_each_image_first():
    plan = pool_plan(num_requests=50, pool_size=10, images_per_request=3, seed=1)
    assert len(set(plan.trace()[:9].tolist())) == 9
    assert set(plan.trace().tolist()) == set(range(10))


def test_cyclic_is_round_robin():
    plan = pool_plan(num_requests=7, pool_size=3, reuse="cyclic")
    assert plan.trace().tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_zipf_skews_towards_low_ids():
    plan = pool_plan(num_requests=5000, pool_size=100, reuse="zipf", zipf_exponent=1.2, seed=2)
    counts = np.bincount(plan.trace(), minlength=100)
    assert counts[0] > 5 * counts[50]


def test_target_reuse_derives_pool_size():
    assert pool_size_for_reuse(1000, 1, 0.8) == 200
    plan = pool_plan(num_requests=1000, target_reuse=0.9)
    ids = plan.trace()
    assert 1 - len(np.unique(ids)) / len(ids) == pytest.approx(0.9)


@pytest.mark.parametrize("kwargs", [dict(num_requests=0), dict(pool_size=-1),
                                    dict(pool_size=2, images_per_request=3), dict(reuse="lru"),
                                    dict(target_reuse=1.0), dict(image_size="0x10"),
                                    dict(image_size="100000x100000"), dict(image_size="abc")])
def test_pool_bad_input(kwargs):
    with pytest.raises(UserError):
        pool_plan(**kwargs)


def test_sizes_weighted():
    assert parse_sizes("640x480:3, 1024x768") == [(640, 480, 3.0), (1024, 768, 1.0)]
    plan = pool_plan(num_requests=10, pool_size=400, image_size="640x480:3,1024x768:1", seed=5)
    share = np.mean(plan.widths == 640)
    assert 0.6 < share < 0.9 and set(plan.heights.tolist()) == {480, 768}


@settings(max_examples=40, deadline=None)
@given(users=st.integers(1, 6), turns=st.integers(1, 6), window=st.integers(1, 5),
       stride=st.integers(0, 3), order=st.sampled_from(["turn-major", "user-major", "random"]))
def test_sliding_window_formula(users, turns, window, stride, order):
    plan = sliding_window_plan(users=users, turns=turns, window=window, stride=stride,
                               order=order, seed=7)
    per_user = window + (turns - 1) * stride
    seen: dict[int, int] = {}
    for row in range(plan.num_rows):
        u, t = int(plan.sessions[row]), int(plan.turns[row])
        expected = [u * per_user + t * stride + j for j in range(window)]
        assert plan.image_ids[row].tolist() == expected
        assert t == seen.get(u, -1) + 1          # each session's rows appear in turn order
        seen[u] = t
    assert plan.num_rows == users * turns


def test_sliding_window_reference_numbers():
    plan = sliding_window_plan()
    ids = plan.trace()
    assert plan.num_rows == 240 and len(ids) == 1200 and len(np.unique(ids)) == 360
    assert 1 - len(np.unique(ids)) / len(ids) == pytest.approx(0.7)
    assert plan.sessions[:30].tolist() == list(range(30))      # turn-major
    assert plan.turns[:30].tolist() == [0] * 30
    assert plan.session_id(0) == "user_0"
    first, second = plan.image_ids[0], plan.image_ids[30]
    assert len(set(first.tolist()) & set(second.tolist())) == 4


def test_sliding_window_users_share_nothing_by_default_and_some_with_fraction():
    def shared_between_users(plan):
        by_user = {}
        for row in range(plan.num_rows):
            by_user.setdefault(int(plan.sessions[row]), set()).update(plan.image_ids[row].tolist())
        return by_user[0] & by_user[1]

    assert not shared_between_users(sliding_window_plan(users=2, turns=3))
    shared = sliding_window_plan(users=2, turns=3, shared_fraction=0.4)
    assert len(shared_between_users(shared)) == 2 + 2
    assert all(len(set(r.tolist())) == 5 for r in shared.image_ids)


def test_text_sharing_keys():
    assert len(set(sliding_window_plan(text_sharing="row").text_keys.tolist())) == 240
    assert len(set(sliding_window_plan(text_sharing="user").text_keys.tolist())) == 30
    assert set(sliding_window_plan(text_sharing="all").text_keys.tolist()) == {0}


@given(total=st.integers(0, 500), shards=st.integers(1, 12))
def test_shard_ranges_cover_everything_in_order(total, shards):
    covered = [i for k in range(shards) for i in shard_range(total, k, shards)]
    assert covered == list(range(total))


def test_shard_range_bad():
    with pytest.raises(UserError):
        shard_range(10, 3, 3)
    with pytest.raises(UserError):
        shard_range(10, 0, 0)
