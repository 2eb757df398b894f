"""The ``mmdatagen`` command: a thin Click layer over the library.

Subcommands are imported only when used, so ``mmdatagen --help`` and small runs start fast.
"""
from __future__ import annotations

import importlib
import sys

import click

from . import __version__
from .errors import UserError

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
        except UserError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mmdatagen")
def cli() -> None:
    """Multimodal benchmark workloads with controlled image reuse, embedding-cache hit-rate
    prediction, an embedded VLM serving simulator and a load generator."""


def main() -> None:
    """Console entry point: usage errors are one line too, exit code 2."""
    try:
        code = cli.main(prog_name="mmdatagen", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    sys.exit(main())
