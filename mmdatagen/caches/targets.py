"""Cache targets as data: what each engine cache keys on, sizes, counts and evicts.

The registry lives in ``data/caches.json``; this module only reads it and converts capacities
from the cache's own unit (GiB, MiB or embedding tokens) into the unit entries are sized in.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Literal

from ..errors import UserError

Unit = Literal["GiB", "MiB", "tokens"]
Entry = Literal["embedding", "processor", "tokens", "embedding-set"]
Eviction = Literal["lru", "fifo", "freeable"]
Moment = Literal["arrival", "schedule", "encode", "completion"]
UNIT_SCALE = {"GiB": 1 << 30, "MiB": 1 << 20, "tokens": 1}
DEFAULT_TARGET = "dynamo-embedding"


@dataclass(frozen=True)
class CacheTarget:
    """One engine cache. ``key`` is an ``io.imageref.KEY_MODES`` value ("uuid": a client uuid
    replaces the content hash of the encoded bytes)."""

    name: str
    engine: str
    description: str
    key: str
    entry: Entry
    unit: Unit
    flag: str
    default_capacity: float
    lookup: Moment
    present: Moment
    repeat_in_request: Literal["hit", "miss"]
    oversize: Literal["bypass", "flush"]
    eviction: Eviction
    touch_request_first: bool
    exact: str
    sources: tuple[str, ...] = ()
    metrics: dict = field(default_factory=dict)
    #: a cache asked first (by name: "vllm-encoder"); only its misses reach this cache
    front: str | None = None
    deployment: str = ""
    #: the engine's own failures the model can reproduce, by ``outcomes.KNOWN_FAULTS`` kind
    #: ("vllm-mm-cache-mirror": vLLM 0.32's API-server mirror fails a request whose insert
    #: evicted an item judged cached)
    faults: tuple[str, ...] = ()

    @property
    def insert_on_lookup(self) -> bool:
        """Entries are present from the lookup itself (else only after encoding/completion)."""
        return self.present == self.lookup

    @property
    def releases(self) -> bool:
        """Entries are pinned by a request and released after its prefill (vLLM's encoder
        cache, alone or as the front tier): the model needs the release event."""
        return self.eviction == "freeable" or self.front is not None

    def resolve(self, size: float | None) -> float:
        """THE capacity of this cache for a size given in its own unit (``--cache-size``, field
        ``cache_size`` everywhere): the size, or the target's default when none is given."""
        size = self.default_capacity if size is None else size
        self.capacity(size)  # finite and >= 0, or one error
        return size

    def size_text(self, size: float | None) -> str:
        """A capacity as people read it, in this cache's unit: ``10 GiB``, ``4096 tokens``."""
        return f"{self.resolve(size):g} {self.unit}"

    def capacity(self, value: float) -> int:
        """A capacity in this cache's own unit -> the unit entries are sized in (bytes/tokens)."""
        if not math.isfinite(value) or value < 0:
            raise UserError(f"cache capacity must be a finite number >= 0, got {value}")
        return int(value * UNIT_SCALE[self.unit])

    def describe(self) -> dict:
        """JSON-ready summary for reports and exports."""
        return {"target": self.name, "engine": self.engine, "unit": self.unit, "flag": self.flag,
                "key": self.key, "entry": self.entry, "lookup": self.lookup,
                "present": self.present, "eviction": self.eviction, "oversize": self.oversize,
                "exact": self.exact, **({"front": self.front} if self.front else {}),
                **({"deployment": self.deployment} if self.deployment else {})}


@lru_cache(maxsize=1)
def _registry() -> dict:
    text = resources.files("mmdatagen").joinpath("data/caches.json").read_text("utf-8")
    return json.loads(text)


def target_names() -> list[str]:
    """Registered target names (aliases not included)."""
    return list(_registry()["targets"])


def get_target(name: str) -> CacheTarget:
    """A target by name or alias (case-insensitive)."""
    reg = _registry()
    key = name.lower()
    key = reg["aliases"].get(key, key)
    entry = reg["targets"].get(key)
    if entry is None:
        raise UserError(f"unknown cache target {name!r}; known: {', '.join(target_names())}")
    fields = {k: v for k, v in entry.items() if not k.startswith("_")}
    fields["sources"] = tuple(fields.get("sources", ()))
    fields["faults"] = tuple(fields.get("faults", ()))
    return CacheTarget(name=key, **fields)
