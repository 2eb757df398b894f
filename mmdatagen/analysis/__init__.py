"""Reuse analysis: exact embedding-cache hit-rate curves from plans, manifests or any dataset.

Entry points: ``lru_hits`` (per-reference hits at one capacity, for the load generator),
``lru_curve`` (every capacity at once), ``trace_from_plan`` / ``trace_from_manifest`` /
``trace_from_dataset`` (what the cache sees) and ``analyze`` (the numbers ``mmdatagen analyze``
prints).
"""
from .lru import Curve, lru_curve, lru_hits, required_capacity
from .predict import Analysis, Semantics, analyze
from .trace import Trace, trace_from_dataset, trace_from_manifest, trace_from_plan

__all__ = ["Curve", "lru_curve", "lru_hits", "required_capacity", "Analysis",
           "Semantics", "analyze", "Trace", "trace_from_dataset", "trace_from_manifest",
           "trace_from_plan"]
