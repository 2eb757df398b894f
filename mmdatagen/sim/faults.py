"""Seeded fault injection for the loader's reliability tests.

Decisions are drawn per request in arrival order from one seeded generator, so a run with the
same seed and the same arrival order injects the same faults into the same requests.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from ..errors import SpecError
from ..settings.sim import Faults


@dataclass(frozen=True)
class FaultConfig:
    error_rate: float = 0.0
    error_status: int = 500
    disconnect_rate: float = 0.0
    stall_first_rate: float = 0.0
    stall_token_rate: float = 0.0
    stall_ms: float = 1000.0
    malformed_rate: float = 0.0
    seed: int = 0

    @classmethod
    def from_spec(cls, faults: Faults) -> FaultConfig:
        """The fault settings of a ``serve`` spec."""
        return cls(faults.fault_error_rate, faults.fault_error_status,
                   faults.fault_disconnect_rate, faults.fault_stall_first_rate,
                   faults.fault_stall_token_rate, faults.fault_stall_ms,
                   faults.fault_malformed_rate, faults.fault_seed)

    def validate(self) -> FaultConfig:
        for name in ("error_rate", "disconnect_rate", "stall_first_rate", "stall_token_rate",
                     "malformed_rate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise SpecError(f"fault_{name}", f"must be in [0, 1], got {v}")
        if not 400 <= self.error_status <= 599:
            raise SpecError("fault_error_status", f"must be 4xx or 5xx, got {self.error_status}")
        if not 0 <= self.stall_ms < float("inf"):
            raise SpecError("fault_stall_ms", "must be a finite number >= 0")
        return self

    @property
    def active(self) -> bool:
        return any((self.error_rate, self.disconnect_rate, self.stall_first_rate,
                    self.stall_token_rate, self.malformed_rate))


@dataclass(frozen=True)
class RequestFaults:
    """What happens to one request. Token positions are 0-based output token indices."""

    error: bool = False
    disconnect_at: int | None = None   # close the connection before sending this token
    stall_first_s: float = 0.0
    stall_at: int | None = None        # stall before sending this token (>= 1)
    malformed_at: int | None = None    # send a malformed SSE event before this token


NO_FAULTS = RequestFaults()


class FaultInjector:
    def __init__(self, cfg: FaultConfig) -> None:
        self.cfg = cfg
        self._rng = random.Random(cfg.seed)

    def draw(self, tokens: int) -> RequestFaults:
        """Faults for the next request that will produce ``tokens`` output tokens."""
        c = self.cfg
        if not c.active:
            return NO_FAULTS
        r = self._rng.random
        pos = self._rng.randrange
        error = r() < c.error_rate
        disconnect = pos(1, tokens) if r() < c.disconnect_rate and tokens > 1 else None
        stall_first = c.stall_ms / 1000.0 if r() < c.stall_first_rate else 0.0
        stall_at = pos(1, tokens) if r() < c.stall_token_rate and tokens > 1 else None
        malformed = pos(0, tokens) if r() < c.malformed_rate else None
        return RequestFaults(error, disconnect, stall_first, stall_at, malformed)
