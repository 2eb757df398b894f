"""Errors a user can cause; the CLI turns them into one line and exit code 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (flags, config, dataset). Printed as one line, exit code 2."""


class DatasetError(UserError):
    """A dataset file that cannot be read or does not follow the AIPerf formats."""
