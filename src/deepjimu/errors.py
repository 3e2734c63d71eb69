"""The one error type for mistakes a user can cause (config, data files, launch, divergence),
and the one exception for a run stopped by a signal."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Interrupted", "JimuError", "OutOfMemory", "one_line", "signals_interrupt"]


class JimuError(Exception):
    """A user-facing error: its message is one line that names the field, file or worker.

    The CLI prints ``error: <message>`` and exits with code 2 instead of a traceback.

    Example:
        >>> raise JimuError("workers must be >= 1 (workers: 0)")
        Traceback (most recent call last):
        ...
        deepjimu.errors.JimuError: workers must be >= 1 (workers: 0)
    """


class OutOfMemory(JimuError):
    """A run that its memory cannot hold: refused before it started, or a worker that passed
    its budget. The CLI exits with :attr:`exit_code` (3), so that ``jimu bench`` records
    the configuration as "does not fit", a result, not a failure."""

    exit_code = 3


class Interrupted(KeyboardInterrupt):
    """The run was stopped by SIGINT or SIGTERM: ``str()`` is one line for the user, and the
    CLI exits with :attr:`exit_code` (128 + the signal: 130, 143), as shells do.

    A KeyboardInterrupt, so that ``except Exception`` blocks let it through as they let
    Ctrl-C through.
    """

    def __init__(self, signum: int, message: str = "") -> None:
        self.signum = signum
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def one_line(e: object) -> str:
    """``str(e)`` with every run of whitespace, newlines included, made one space."""
    return " ".join(str(e).split())


@contextlib.contextmanager
def signals_interrupt(once: bool = False) -> Iterator[None]:
    """For the block, SIGINT and SIGTERM raise :class:`Interrupted` (the old handlers after).

    Python's default ends the process on SIGTERM without unwinding, and raises a bare
    KeyboardInterrupt on SIGINT; with this, both unwind (locks released, workers stopped)
    and name the signal. Outside the main thread, where handlers cannot be set, a no-op.

    With ``once``, the signals after the first are ignored from then on, for a process on
    its way out: a worker that Ctrl-C reached is sent SIGTERM by its launcher a moment
    later, which would otherwise cut its clean-up short (its progress bar, its error
    record) at any line. The launcher kills it outright if the clean-up hangs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if once:
            for s in sigs:
                signal.signal(s, signal.SIG_IGN)
        fired = True
        raise Interrupted(signum)

    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        if not (once and fired):  # else ignored until the process ends
            for s in sigs:
                signal.signal(s, old[s])
