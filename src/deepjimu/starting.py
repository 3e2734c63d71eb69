"""How the local launcher starts its workers: spawned, or forked from a fork server, and a
forked worker's environment made its launcher's.

Spawned (the default) each worker is a fresh interpreter, as a cluster's node starts them,
and imports torch itself: 2 s of CPU, and 1-2 s more for the compiler that torch's DDP and
optimizers load. ``DEEPJIMU_START_METHOD=forkserver`` forks them instead from one process
that has imported what ``multiprocessing.set_forkserver_preload`` names (the test suite
sets both: most of a short run's cost is these imports). A forked worker starts with the
fork server's environment, made when the server started, not with its launcher's
(multiprocessing gives it the launcher's working folder, not its environment): the
launcher hands its own to each worker, which :func:`adopt` makes the worker's, keeping the
variables torch's launcher gave its rank. What cannot follow: OpenMP read its settings
(``OMP_WAIT_POLICY``) when the server loaded torch; and memory a forked worker shares with
its server is charged to the server's cgroup, so workers with a memory budget are always
spawned.
"""

from __future__ import annotations

import os
import tempfile

from deepjimu.errors import JimuError

__all__ = ["START_METHOD", "adopt", "start_method"]

START_METHOD = "DEEPJIMU_START_METHOD"
"""The environment variable that chooses how the workers start: spawn or forkserver."""

_LOADED = dict(os.environ)
# this process's environment when this module loaded: in a worker, before torch's launcher
# gave it its rank's variables (the worker's function is unpickled, importing this, first)

_RANK_VARIABLES = frozenset(
    ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
     "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
)  # fmt: skip


def start_method(budgeted: bool) -> str:
    """How the workers start (:data:`START_METHOD`; spawn where they have a memory budget).

    Raises:
        JimuError: the variable names another method, in one line.
    """
    method = os.environ.get(START_METHOD, "") or "spawn"
    if method not in ("spawn", "forkserver"):
        raise JimuError(f"{START_METHOD}={method}: the workers start by spawn or forkserver")
    return "spawn" if budgeted else method


def adopt(launcher: dict[str, str]) -> None:
    """Make this worker's environment its launcher's, ``launcher``, with the variables torch's
    launcher set for its rank (those it changed since this module loaded, and its rank and
    rendezvous variables). A spawned worker's is the same environment already."""
    own = {
        k: v
        for k, v in os.environ.items()
        if _LOADED.get(k) != v or k in _RANK_VARIABLES or k.startswith("TORCHELASTIC_")
    }
    os.environ.clear()
    os.environ.update(launcher)
    os.environ.update(own)
    tempfile.tempdir = None  # TMPDIR read again where a temporary file is next made
