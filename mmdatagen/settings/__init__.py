"""Typed specs behind every command: one declaration per option (flag, help, default, bounds).

- ``base``: the machinery (:func:`option`, :func:`spec`, :func:`validate`, :class:`SpecError`).
- ``cli``: Click options generated from specs, ``--config`` presets, flag-named errors.
- ``workload``, ``content``: the generators; ``merge``: ``merge``'s output; ``load``:
  ``bench``/``ab``; ``sweep``: the grid and target of ``sweep``; ``report``:
  ``--no-report``/``--png``; ``sim``: ``serve`` and ``simulate``; ``cache``: cache capacity and
  keying (owned by the lead engineer); ``run``: one benchmark run (``BenchRun``, what ``bench``,
  each ``ab`` run and each ``sweep`` run hand the loader), composed of the specs above.

Library code takes the frozen dataclasses; only ``cli`` imports Click.
"""
from .base import SpecError, build, option, spec, validate

__all__ = ["SpecError", "build", "option", "spec", "validate"]
