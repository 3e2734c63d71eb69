"""The one error type for mistakes a user can cause (config, data files, launch, divergence)."""

from __future__ import annotations

__all__ = ["JimuError", "one_line"]


class JimuError(Exception):
    """A user-facing error: its message is one line that names the field, file or worker.

    The CLI prints ``error: <message>`` and exits with code 2 instead of a traceback.

    Example:
        >>> raise JimuError("workers must be >= 1 (workers: 0)")
        Traceback (most recent call last):
        ...
        deepjimu.errors.JimuError: workers must be >= 1 (workers: 0)
    """


def one_line(e: object) -> str:
    """``str(e)`` with every run of whitespace, newlines included, made one space."""
    return " ".join(str(e).split())
