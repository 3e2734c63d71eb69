"""How a process that ran a process group leaves: output flushed, without Python's shutdown.

Gloo's worker threads release finished collectives, which hold Python tensors, some time
after the caller has seen them complete; a worker stopped by a signal or an error can
also leave one in flight. When that release falls into the interpreter's shutdown, the
thread cannot take the GIL and the process aborts ("terminate called without an active
exception", then SIGABRT and a "Fatal Python error" dump on stderr). Core dumps here showed
it twice: ``AsyncBarrierWork``'s destructor after a complete torchrun run (about 1 run in
8), and ``AsyncAllgatherWork``'s in a ddp worker that Ctrl-C stopped mid-step (about 1 in
10 on a loaded 2-core machine); pytorch/pytorch#179291 describes the same crash. Skipping
the shutdown is safe here: by then every file was closed or renamed into place.

No torch import: the command line uses this.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

__all__ = ["group_started", "leave", "leave_at_exit"]

_started = False


def group_started() -> None:
    """Note that this process has started a process group (and with it gloo's threads)."""
    global _started
    _started = True


def leave(code: int) -> NoReturn:
    """Exit with ``code``: by ``os._exit`` after flushing once a group ran here, else ``sys.exit``."""
    if not _started:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def leave_at_exit(code: int) -> None:
    """When this process's shutdown begins (someone else calls ``sys.exit``), :func:`leave`.

    For a process whose last steps are not ours (a worker that multiprocessing started
    returns to it, which then calls ``sys.exit``). ``atexit`` runs its hooks first in the
    shutdown, before the interpreter stops other threads.
    """
    if _started:
        atexit.register(leave, code)
