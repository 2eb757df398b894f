"""Engine caches: the targets users size (``targets``, data in ``data/caches.json``), their
semantics, implemented once (``model``) for the simulator, the loader's prediction and the
reference replays of the analysis, and what an image, a clip or a request puts in them
(``entries``)."""
from .model import (
    RESET_PATHS,
    TIMELINE_PATH,
    CacheModel,
    FreeableCache,
    OrderedCache,
    TieredCache,
    make_cache,
)
from .targets import DEFAULT_TARGET, CacheTarget, get_target, target_names

__all__ = ["RESET_PATHS", "TieredCache", "TIMELINE_PATH", "CacheModel", "FreeableCache", "OrderedCache", "make_cache", "DEFAULT_TARGET",
           "CacheTarget", "get_target", "target_names"]
