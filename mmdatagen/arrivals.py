"""The arrival process shared by the loader (real time) and ``simulate`` (virtual time).

With a request rate, request k starts no earlier than slot k: slot 0 is the first request's
time, and each next slot adds a gap of ``1/rate`` (constant), an exponential draw with mean
``1/rate`` (poisson) or a gamma draw of shape ``burstiness`` and mean ``1/rate`` (gamma: vLLM's
``--burstiness``; below 1 burstier than Poisson, above 1 more regular, 1 is Poisson in law). The
same seed draws the same gaps in both, so a paced ``bench`` and its ``simulate`` prediction see
the same schedule.

A ramp (``ramp_to``, over ``ramp_s`` seconds from the first slot) makes the rate rise (or fall)
linearly from ``rate`` to ``ramp_to`` and stay there: the gaps are drawn with mean 1 in
operational time ``L(t) = rate t + (ramp_to - rate) t^2 / (2 ramp_s)`` (the integral of the
rate), and each slot is ``L^-1`` of their running sum, the time-rescaling construction of a
non-homogeneous process; constant arrivals then fall exactly where ``L(t)`` crosses an integer.
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np

Arrival = Literal["poisson", "constant", "gamma"]
ARRIVALS: tuple[str, ...] = ("poisson", "constant", "gamma")


class Pacer:
    """Paced start slots. ``unit`` scales the gaps (1.0: seconds; 1000.0: milliseconds)."""

    def __init__(self, rate: float, arrival: str = "poisson", seed: int = 0,
                 unit: float = 1.0, burstiness: float = 1.0, ramp_to: float | None = None,
                 ramp_s: float | None = None) -> None:
        if arrival not in ARRIVALS:
            raise ValueError(f"unknown arrival process {arrival!r}")
        if not (math.isfinite(rate) and rate > 0 and math.isfinite(burstiness)
                and burstiness > 0):
            raise ValueError("rate and burstiness must be finite and positive")
        if ramp_to is not None and not (math.isfinite(ramp_to) and ramp_to > 0 and ramp_s
                                        and math.isfinite(ramp_s) and ramp_s > 0):
            raise ValueError("a ramp needs a finite positive target rate and duration")
        self.rate, self.arrival, self.unit = rate, arrival, unit
        self.burstiness, self.ramp_to, self.ramp_s = burstiness, ramp_to, ramp_s
        self.rng = np.random.default_rng(seed)
        self.next_slot: float | None = None
        self._start = 0.0
        self._op = 0.0  # operational time reached (ramps only)

    def gap(self) -> float:
        """One gap in seconds at the base rate."""
        if self.arrival == "constant":
            return 1.0 / self.rate
        if self.arrival == "gamma":
            b = self.burstiness
            return float(self.rng.gamma(b, 1.0 / (self.rate * b)))
        return float(self.rng.exponential(1.0 / self.rate))

    def take(self, now: float) -> float:
        """The next slot (the first one is ``now``); advances the schedule by one gap."""
        if self.next_slot is None:
            self.next_slot, self._start = now, now
        slot = self.next_slot
        if self.ramp_to is None:
            self.next_slot += self.gap() * self.unit
        else:
            self._op += self.gap() * self.rate  # a gap of mean 1 in operational time
            self.next_slot = self._start + self.ramp_time(self._op) * self.unit
        return slot

    def ramp_time(self, op: float) -> float:
        """Seconds from the first slot at which operational time ``op`` is reached."""
        r0, r1, span = self.rate, self.ramp_to, self.ramp_s
        assert r1 is not None and span is not None
        slope = (r1 - r0) / span
        at_end = r0 * span + slope * span * span / 2
        if op >= at_end:
            return span + (op - at_end) / r1
        if abs(slope) < 1e-12:
            return op / r0
        # r0 t + slope t^2 / 2 = op, the root in [0, span]; written without cancellation
        return 2 * op / (r0 + math.sqrt(r0 * r0 + 2 * slope * op))


def make_pacer(rate: float | None, arrival: str = "poisson", seed: int = 0, *,
               unit: float = 1.0, burstiness: float = 1.0, ramp_to: float | None = None,
               duration_s: float | None = None, count: int | None = None) -> Pacer | None:
    """The run's pacer (None without a rate). A ramp spans the benchmark duration, or without
    one the time ``count`` requests take at the ramp's mean rate."""
    if not rate:
        return None
    span = None
    if ramp_to is not None:
        span = duration_s or (count / ((rate + ramp_to) / 2) if count else None)
        if not span:
            raise ValueError("a ramp needs a benchmark duration or a request count")
    return Pacer(rate, arrival, seed, unit, burstiness, ramp_to, span)
