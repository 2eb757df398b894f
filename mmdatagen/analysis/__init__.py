"""Reuse analysis: exact embedding-cache hit-rate curves from plans, manifests or any dataset."""
from .lru import Curve, lru_curve, lru_hits, required_capacity
from .replay import replay_lru

__all__ = ["Curve", "lru_curve", "lru_hits", "required_capacity", "replay_lru"]
