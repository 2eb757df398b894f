"""``python -m mmdatagen.sim.child``: the embedded simulator's one entry point.

It reads its settings as a :class:`mmdatagen.spec.sim.Simulator` in JSON on standard input
(written by :class:`mmdatagen.sim.embedded.EmbeddedServer`, which closes the pipe), checks them
field by field, and serves until SIGTERM/SIGINT. Like the CLI, bad settings are one ``error:``
line and exit code 2. It dies with the parent named in ``MMDATAGEN_DIE_WITH_PARENT`` (the kernel
sends SIGTERM even when that parent is SIGKILLed: ``lifecycle.install_handlers``).
"""
from __future__ import annotations

import sys

from ..errors import SpecError, UserError
from ..lifecycle import (
    EXIT_ENVIRONMENT,
    EXIT_USER,
    describe_os_error,
    install_handlers,
    interrupt_exit_code,
    is_environment_error,
)


def main() -> int:
    install_handlers()  # first: die with the parent, SIGTERM like Ctrl-C
    from ..spec.base import for_cli
    from ..spec.sim import Simulator
    from .run import serve_spec

    try:
        serve_spec(Simulator.from_json(sys.stdin.buffer.read()))
    except SpecError as exc:
        print(f"error: {for_cli(exc)}", file=sys.stderr, flush=True)
        return EXIT_USER
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USER
    except KeyboardInterrupt as exc:  # a signal before the server's own handlers are set
        return interrupt_exit_code(exc)
    except OSError as exc:
        print(f"error: {describe_os_error(exc)}", file=sys.stderr, flush=True)
        return EXIT_ENVIRONMENT if is_environment_error(exc) else EXIT_USER
    return 0


if __name__ == "__main__":
    sys.exit(main())
