"""The error a user's input causes: the command line reports it as one line ``error: ...`` with exit code 2."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """Bad input (an option value, a prompt, a file, a checkpoint): the message names the argument or the file."""
