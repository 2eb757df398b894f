"""The arrival process (``mmdatagen.arrivals``): gamma gaps with vLLM's burstiness, linear rate
ramps, one schedule for the loader and ``simulate``, and the options' checks."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.arrivals import Pacer, make_pacer


def _slots(pacer: Pacer, n: int) -> np.ndarray:
    return np.array([pacer.take(0.0) for _ in range(n)])


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_gamma_gaps_keep_the_mean_and_set_the_spread(b):
    """Shape b, mean 1/rate: the coefficient of variation of the gaps is 1/sqrt(b)."""
    gaps = np.diff(_slots(Pacer(20.0, "gamma", seed=7, burstiness=b), 40001))
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(b), rel=0.05)


def test_burstiness_one_is_poisson_in_law():
    gamma = np.diff(_slots(Pacer(10.0, "gamma", seed=1, burstiness=1.0), 20001))
    poisson = np.diff(_slots(Pacer(10.0, "poisson", seed=2), 20001))
    qs = [0.1, 0.5, 0.9, 0.99]
    assert np.quantile(gamma, qs) == pytest.approx(np.quantile(poisson, qs), rel=0.08)


def test_the_same_seed_draws_the_same_gaps():
    a = _slots(make_pacer(5.0, "gamma", 3, burstiness=0.5), 50)
    b = _slots(make_pacer(5.0, "gamma", 3, burstiness=0.5, unit=1000.0), 50) / 1000.0
    assert np.allclose(a, b, rtol=0, atol=1e-12)  # the loader's seconds, simulate's ms
    assert not np.allclose(a, _slots(make_pacer(5.0, "gamma", 4, burstiness=0.5), 50))


@settings(max_examples=60, deadline=None)
@given(r0=st.floats(0.5, 200), r1=st.floats(0.5, 200), span=st.floats(0.5, 100))
def test_constant_ramp_slots_are_where_the_rate_integral_crosses_integers(r0, r1, span):
    """Slot k is the time t with r0 t + (r1 - r0) t^2 / (2 span) = k (after the ramp: the
    end rate); slots never go back."""
    pacer = Pacer(r0, "constant", ramp_to=r1, ramp_s=span)
    n = int(r0 * span + (r1 - r0) * span / 2) + 20
    slots = _slots(pacer, n)
    assert np.all(np.diff(slots) > 0)
    t = np.asarray(slots, dtype=np.float64)
    op = np.where(t <= span, r0 * t + (r1 - r0) * t * t / (2 * span),
                  r0 * span + (r1 - r0) * span / 2 + r1 * (t - span))
    k = np.arange(len(t), dtype=np.float64)
    assert np.all(np.abs(op - k) <= np.maximum(1e-9 * k, 1e-7)), np.abs(op - k).max()


def test_a_ramp_spans_the_request_count_at_its_mean_rate():
    """Without a duration, N requests ramping 10 -> 30 req/s take N / 20 seconds, and the
    second half of the time carries more of them."""
    slots = _slots(make_pacer(10.0, "constant", ramp_to=30.0, count=400), 400)
    assert slots[-1] == pytest.approx(400 / 20, rel=0.01)
    assert (slots < 10).sum() < (slots >= 10).sum()
    poisson = _slots(make_pacer(10.0, "poisson", seed=5, ramp_to=30.0, count=4000), 4000)
    assert poisson[-1] == pytest.approx(4000 / 20, rel=0.05)


def test_bad_arrival_values_are_refused():
    for kw in ({"rate": 0.0}, {"rate": math.nan}, {"burstiness": 0.0},
               {"ramp_to": 5.0}, {"ramp_to": -1.0, "ramp_s": 2.0}):
        args = {"rate": 1.0, **kw}
        with pytest.raises(ValueError):
            Pacer(args.pop("rate"), "gamma", **args)
    with pytest.raises(ValueError):
        make_pacer(1.0, ramp_to=2.0)  # no span: neither a duration nor a count


def test_simulate_follows_the_gamma_schedule(tmp_path):
    """simulate starts requests on the very slots the loader's pacer draws."""
    import orjson
    from sim_helpers import fast_profile

    from mmdatagen.sim.virtual import OutputPolicy, load_turns, simulate

    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"text": f"row {i}"}) + b"\n" for i in range(30)))
    prof = fast_profile(step_base_ms=1.0)
    res = simulate(load_turns(path, prof), prof, 0.0, 64, 30, policy=OutputPolicy(2, 2, True),
                   request_rate=40.0, arrival="gamma", seed=9, burstiness=0.3)
    starts = np.array(sorted(r.start_ns for r in res.records)) / 1e9
    want = _slots(make_pacer(40.0, "gamma", 9, burstiness=0.3), 30)
    assert np.allclose(starts - starts[0], want - want[0], atol=2e-6)


@pytest.mark.parametrize("args,needle", [
    (["--request-rate", "5", "--burstiness", "2"], "--burstiness needs --arrival gamma"),
    (["--ramp-to", "5"], "--ramp-to needs --request-rate"),
    (["--request-rate", "5", "--arrival", "gamma", "--burstiness", "0"], "--burstiness"),
])
def test_arrival_options_are_checked_at_the_edge(run_cli, tmp_path, args, needle):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    for cmd in (["bench", "--input-file", str(data)], ["simulate", str(data)]):
        res = run_cli(*cmd, *args, "--output-dir", tmp_path / "o")
        assert res.exit_code == 2, res.output
        assert needle in res.output and "Traceback" not in res.output
