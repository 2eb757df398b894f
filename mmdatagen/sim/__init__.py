"""The serving simulator: a performance model of a VLM server, not a language model.

- ``profile``: engine-model parameters, loaded from ``configs/profiles/<name>.yaml``
- ``cache``: the byte-LRU embedding cache and its counters
- ``engine``: continuous batching in discrete steps (shared by virtual and real time)
- ``protocol``: OpenAI request parsing (image keys and sizes via ``io/imageref`` and ``vlm``)
  and pre-serialised responses
- ``server`` / ``run``: the aiohttp server (``mmdatagen serve``); ``faults``: seeded faults
- ``virtual``: whole benchmarks in virtual time (``mmdatagen simulate``)
- ``embedded``: ``EmbeddedServer``, the loader's default target (a subprocess)
- ``probe`` / ``seedset``: a minimal client and seed-A-shaped datasets for checks and benchmarks
"""
