"""The ``mmdatagen`` command: a thin Click layer over the library.

Subcommands are imported only when used, so ``mmdatagen --help`` and small runs start fast.
"""
from __future__ import annotations

import importlib
import sys

import click

from . import __version__
from .errors import SpecError, UserError
from .lifecycle import (
    EXIT_ENVIRONMENT,
    EXIT_USER,
    describe_os_error,
    exit_now,
    install_handlers,
    interrupt_exit_code,
    is_environment_error,
)
from .spec.base import for_cli

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
        except SpecError as exc:  # a library-level field error: name the flag here, at the edge
            click.echo(f"error: {for_cli(exc)}", err=True)
            ctx.exit(2)
        except UserError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(EXIT_USER)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (lifecycle.Terminated)
            click.echo("terminated" if interrupt_exit_code(exc) != 130 else "interrupted", err=True)
            exit_now(interrupt_exit_code(exc))
        except OSError as exc:  # disk full, file-size limit: exit 1; a bad path: exit 2
            message = describe_os_error(exc)
            if exc.filename is None and _stdout_broken(exc):
                message = f"cannot write to standard output: {message}"
            click.echo(f"error: {message}", err=True)
            ctx.exit(EXIT_ENVIRONMENT if is_environment_error(exc) else EXIT_USER)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mmdatagen")
def cli() -> None:
    """Multimodal benchmark workloads with controlled image reuse, embedding-cache hit-rate
    prediction, an embedded VLM serving simulator and a load generator."""


def main() -> None:
    """Console entry point: usage errors are one line too, exit code 2."""
    install_handlers()  # SIGTERM like Ctrl-C; a file-size limit is an error, not a core dump
    try:
        sys.stdout.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]  # non-UTF-8 paths as bytes
    except (AttributeError, ValueError):
        pass
    try:
        code = cli.main(prog_name="mmdatagen", standalone_mode=False)
        if code:
            _silence_stdout(flush=True)
        else:
            sys.stdout.flush()
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # stdout closed or full (``> /dev/full``, a closed pipe)
        _silence_stdout()
        click.echo(f"error: cannot write to standard output: {describe_os_error(exc)}", err=True)
        sys.exit(EXIT_ENVIRONMENT)
    sys.exit(code if isinstance(code, int) else 0)


def _stdout_broken(exc: OSError) -> bool:
    """True (and stdout silenced) when ``exc`` came from printing to standard output."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "echo" and "click" in code.co_filename \
                and not tb.tb_frame.f_locals.get("err"):
            _silence_stdout()
            return True
        tb = tb.tb_next
    return False


def _silence_stdout(flush: bool = False) -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again (after an
    error already reported: a failing flush then stays silent)."""
    import os

    if flush:
        try:
            sys.stdout.flush()
            return
        except (OSError, ValueError):
            pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main()
