"""Errors the CLI turns into one line: bad input (exit code 2) and a failed run (exit code 1).

The one mapping from errors to exit codes is ``lifecycle.outcome``."""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (flags, config, dataset). Printed as one line, exit code 2."""


class DatasetError(UserError):
    """A dataset file that cannot be read or does not follow the AIPerf formats."""


class SpecError(UserError):
    """A value that fails its field's checks, raised anywhere in the library. ``str()`` names the
    field; the CLI edge names the flag (``settings.base.for_cli``)."""

    def __init__(self, name: str, problem: str) -> None:
        self.name, self.problem = name, problem
        super().__init__(f"{name} {problem}")

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str]]:
        return type(self), (self.name, self.problem)  # crosses process pools intact


class RunFailed(Exception):
    """A run that ended without a result: every request failed. Its partial outputs are written;
    the CLI prints one line and exits with code 1 (the input was fine, the run was not)."""
