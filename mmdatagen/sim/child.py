"""``python -m mmdatagen.sim.child``: the embedded simulator's one entry point.

It reads its settings as a :class:`mmdatagen.settings.sim.Simulator` in JSON on standard input
(written by :class:`mmdatagen.sim.embedded.EmbeddedServer`, which closes the pipe), checks them
field by field, and serves until SIGTERM/SIGINT. Like the CLI (``lifecycle.outcome``), bad
settings are one ``error:`` line and exit code 2; SIGTERM exits 143. It dies with the parent
named in ``MMDATAGEN_DIE_WITH_PARENT`` (the kernel sends SIGTERM even when that parent is
SIGKILLed: ``lifecycle.install_handlers``).
"""
from __future__ import annotations

import sys

from ..errors import SpecError
from ..lifecycle import guard_standard_streams, install_handlers, outcome


def main() -> int:
    install_handlers()  # first: die with the parent, SIGTERM like Ctrl-C
    guard_standard_streams()
    from ..settings.base import for_cli
    from ..settings.sim import Simulator
    from .run import serve_spec

    try:
        serve_spec(Simulator.from_json(sys.stdin.buffer.read()))
    except (Exception, KeyboardInterrupt) as exc:  # the CLI's exit-code policy (lifecycle.outcome)
        result = outcome(for_cli(exc) if isinstance(exc, SpecError) else exc)
        if result is None:
            raise
        print(result[1], file=sys.stderr, flush=True)
        return result[0]
    return 0


if __name__ == "__main__":
    sys.exit(main())
