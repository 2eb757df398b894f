"""Engine caches: the targets users size (``targets``, data in ``data/caches.json``) and their
semantics, implemented once (``model``) for the simulator, the loader's prediction and the
reference replays of the analysis."""
from .model import TIMELINE_PATH, CacheModel, FreeableCache, OrderedCache, make_cache
from .targets import DEFAULT_TARGET, CacheTarget, get_target, target_names

__all__ = ["TIMELINE_PATH", "CacheModel", "FreeableCache", "OrderedCache", "make_cache", "DEFAULT_TARGET",
           "CacheTarget", "get_target", "target_names"]
