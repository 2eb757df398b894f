"""The ``mmdatagen`` command: a thin Click layer over the library.

Subcommands are imported only when used, so ``mmdatagen --help`` and small runs start fast.
"""
from __future__ import annotations

import importlib
import sys

import click

from . import __version__
from .errors import SpecError
from .lifecycle import (
    StdoutError,
    exit_now,
    guard_standard_streams,
    install_handlers,
    outcome,
    silence_stdout,
)
from .settings.base import for_cli

# name -> "module:attribute" of a click.Command; each area owns its module in mmdatagen/commands/.
COMMANDS: dict[str, str] = {
    "pool": "mmdatagen.commands.generate:pool",
    "sliding-window": "mmdatagen.commands.generate:sliding_window",
    "analyze": "mmdatagen.commands.analyze:analyze",
    "serve": "mmdatagen.commands.serve:serve",
    "simulate": "mmdatagen.commands.serve:simulate",
    "bench": "mmdatagen.commands.bench:bench",
    "ab": "mmdatagen.commands.bench:ab",
    "compare": "mmdatagen.commands.bench:compare",
    "merge": "mmdatagen.commands.merge:merge",
    "merge-runs": "mmdatagen.commands.merge:merge_runs",
    "sweep": "mmdatagen.commands.sweep:sweep",
    "calibrate": "mmdatagen.commands.calibrate:calibrate",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use; user errors become one line, exit 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.exceptions.ClickException:
            raise  # a subcommand's usage error: click's own (one line in main)
        except Exception as exc:
            ctx.exit(_fail(exc))
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (lifecycle.Terminated)
            exit_now(_fail(exc))


def _fail(exc: BaseException) -> int:
    """THE error path of every command: one stderr line, the exit code of ``lifecycle.outcome``
    (143 SIGTERM, 130 Ctrl-C, 1 a failed run or the machine, 2 bad input). Anything else is a
    bug and keeps its traceback."""
    if isinstance(exc, click.exceptions.Abort) and isinstance(exc.__context__, KeyboardInterrupt):
        exc = exc.__context__  # click turns a signal outside a command into Abort
    if isinstance(exc, click.ClickException):
        click.echo(f"error: {exc.format_message()}", err=True)
        return exc.exit_code
    if isinstance(exc, click.exceptions.Abort):
        exc = KeyboardInterrupt()
    result = outcome(for_cli(exc) if isinstance(exc, SpecError) else exc)
    if result is None:
        raise exc
    code, line = result
    if isinstance(exc, StdoutError):
        silence_stdout()
    click.echo(line, err=True)
    return code


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mmdatagen")
def cli() -> None:
    """Multimodal benchmark workloads with controlled image reuse, embedding-cache hit-rate
    prediction, an embedded VLM serving simulator and a load generator."""


def main() -> None:
    """Console entry point: every failure (usage errors too) is one line and its exit code."""
    install_handlers()  # SIGTERM like Ctrl-C; a file-size limit is an error, not a core dump
    guard_standard_streams()  # every stdout write checked; non-UTF-8 paths printed as bytes
    try:
        code = cli.main(prog_name="mmdatagen", standalone_mode=False)
        sys.stdout.flush()
    except (Exception, KeyboardInterrupt) as exc:
        code = _fail(exc)
        if isinstance(exc, (KeyboardInterrupt, click.exceptions.Abort)):
            exit_now(code)
    if code:
        silence_stdout()  # an error was reported: a failing final flush stays silent
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
