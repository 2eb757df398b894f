"""Per-modality reuse of a manifest at one capacity: ``predict.analyze`` shaped per modality
(videos and audio clips share one cache with the images; see ``media``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..vlm import VisionModel
from .predict import Semantics, analyze
from .trace import trace_from_manifest


@dataclass
class ModalityReuse:
    """One modality's numbers at one capacity."""

    references: int = 0
    distinct: int = 0
    hits: int = 0
    bytes_referenced: int = 0
    bytes_hit: int = 0
    tokens_referenced: int = 0
    tokens_saved: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.references if self.references else 0.0


@dataclass
class MediaReuse:
    """Per-modality results at one capacity (``total`` sums them)."""

    by_modality: dict[str, ModalityReuse] = field(default_factory=dict)

    @property
    def total(self) -> ModalityReuse:
        out = ModalityReuse()
        for r in self.by_modality.values():
            for name in vars(out):
                setattr(out, name, getattr(out, name) + getattr(r, name))
        return out


def media_reuse(manifest, model: VisionModel, target, capacity: int) -> MediaReuse:
    """A manifest's per-modality reuse in one cache of ``target`` at ``capacity`` (its entry
    unit), requests one after another: ``predict.analyze`` at that one capacity."""
    a = analyze(trace_from_manifest(manifest), model, Semantics(target=target.name), [capacity],
                want_curve=False)
    totals = a.summary["modalities"]
    row = a.summary["capacities"][0]["by_modality"]
    return MediaReuse({m: ModalityReuse(t["references"], t["distinct"], row[m]["hits"],
                                        t["bytes"], row[m]["bytes_hit"], t["tokens"],
                                        row[m]["tokens_saved"]) for m, t in totals.items()})
