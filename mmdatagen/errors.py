"""Errors a user can cause; the CLI turns them into one line and exit code 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (flags, config, dataset). Printed as one line, exit code 2."""


class DatasetError(UserError):
    """A dataset file that cannot be read or does not follow the AIPerf formats."""


class SpecError(UserError):
    """A value that fails its field's checks, raised anywhere in the library. ``str()`` names the
    field; the CLI edge names the flag (``spec.base.for_cli``)."""

    def __init__(self, name: str, problem: str) -> None:
        self.name, self.problem = name, problem
        super().__init__(f"{name} {problem}")

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str]]:
        return type(self), (self.name, self.problem)  # crosses process pools intact
