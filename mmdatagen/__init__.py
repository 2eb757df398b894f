"""mmdatagen: multimodal benchmark workloads, cache-reuse analysis, a VLM simulator and a loader."""
from __future__ import annotations

__version__ = "0.1.0"
