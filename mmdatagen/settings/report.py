"""The report options of ``bench``, ``ab``, ``compare`` and ``sweep``."""
from __future__ import annotations

from dataclasses import dataclass

from .base import option, spec


@spec
@dataclass(frozen=True)
class ReportOutput:
    """``report.html`` beside the results, and its plots as PNGs on request."""

    no_report: bool = option(False, "--no-report", "Do not write report.html.", is_flag=True)
    png: bool = option(False, "--png", "Also write the report's plots as PNG files in plots/ "
                       "(matplotlib).", is_flag=True)
