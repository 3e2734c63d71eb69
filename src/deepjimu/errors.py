"""The one error type for mistakes a user can cause (config, data files, launch, divergence)."""

from __future__ import annotations

__all__ = ["JimuError"]


class JimuError(Exception):
    """A user-facing error: its message is one line that names the field, file or worker.

    The CLI prints ``error: <message>`` and exits with code 2 instead of a traceback.

    Example:
        >>> raise JimuError("workers must be >= 1 (workers: 0)")
        Traceback (most recent call last):
        ...
        deepjimu.errors.JimuError: workers must be >= 1 (workers: 0)
    """
