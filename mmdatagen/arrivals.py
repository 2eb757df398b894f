"""The arrival process shared by the loader (real time) and ``simulate`` (virtual time).

With a request rate, request k starts no earlier than slot k: slot 0 is the first request's
time, and each next slot adds a gap of ``1/rate`` (constant) or an exponential draw with mean
``1/rate`` (poisson, seeded). The same seed draws the same gaps in both, so a paced ``bench``
and its ``simulate`` prediction see the same schedule.
"""
from __future__ import annotations

from typing import Literal

import numpy as np

Arrival = Literal["poisson", "constant"]
ARRIVALS: tuple[str, ...] = ("poisson", "constant")


class Pacer:
    """Paced start slots. ``unit`` scales the gaps (1.0: seconds; 1000.0: milliseconds)."""

    def __init__(self, rate: float, arrival: str = "poisson", seed: int = 0,
                 unit: float = 1.0) -> None:
        if arrival not in ARRIVALS:
            raise ValueError(f"unknown arrival process {arrival!r}")
        self.rate, self.arrival, self.unit = rate, arrival, unit
        self.rng = np.random.default_rng(seed)
        self.next_slot: float | None = None

    def gap(self) -> float:
        if self.arrival == "constant":
            return 1.0 / self.rate
        return float(self.rng.exponential(1.0 / self.rate))

    def take(self, now: float) -> float:
        """The next slot (the first one is ``now``); advances the schedule by one gap."""
        if self.next_slot is None:
            self.next_slot = now
        slot = self.next_slot
        self.next_slot += self.gap() * self.unit
        return slot
