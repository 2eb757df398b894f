"""Materialise a plan into a dataset: item files, texts, JSONL rows and the manifest.

- ``pipeline``: :func:`generate` (one shard of a plan -> its JSONL, files and manifest), the
  output options and the row writer.
- ``items``: the images, videos and audios of one run: delivery (what rows carry), manifest
  entries, bounded inline caches.
- ``workers``: the worker processes and the render tasks that run in them.
"""
from __future__ import annotations

from .items import DELIVERIES, Delivery
from .pipeline import OUTPUT_FORMATS, OutputSpec, Result, default_image_dir, generate, progress
from .workers import start_workers, stop_workers

__all__ = ["DELIVERIES", "OUTPUT_FORMATS", "Delivery", "OutputSpec", "Result", "default_image_dir",
           "generate", "progress", "start_workers", "stop_workers"]
