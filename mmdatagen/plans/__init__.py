"""Workload plans: rows of image ids, sessions and order (pure data)."""
from .base import Plan, shard_range
from .pool import REUSE_PATTERNS, pool_plan
from .sliding_window import ORDERS, TEXT_SHARING, sliding_window_plan

__all__ = ["Plan", "shard_range", "pool_plan", "sliding_window_plan", "REUSE_PATTERNS", "ORDERS",
           "TEXT_SHARING"]
