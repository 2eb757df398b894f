"""The serving simulator: a performance model of a VLM server, not a language model.

- ``profile``: engine-model parameters, loaded from ``configs/profiles/<name>.yaml``
- ``cache``: the byte-LRU embedding cache and its counters
- ``engine``: continuous batching in discrete steps (shared by virtual and real time)
- ``protocol``: OpenAI request parsing (image keys and sizes via ``io/imageref`` and ``vlm``)
  and pre-serialised responses
- ``server`` / ``run``: the aiohttp server (``mmdatagen serve``); ``faults``: seeded faults
- ``virtual``: whole benchmarks in virtual time (``mmdatagen simulate``)
- ``embedded``: ``EmbeddedServer``, the loader's default target (a subprocess started through
  ``child``, which reads its ``settings.sim.Simulator`` settings as JSON on stdin)
- ``study``: the library call behind ``simulate``; ``media``: video/audio items' prices
- ``probe``: a minimal closed-loop client for checks and benchmarks (their seed-A-shaped
  datasets come from the real generator: ``tests/sim_datasets.py``)
"""
