"""``--emulate-speeds``: rehearse a cluster of workers of different speeds on one machine.

Each worker process runs in a CPU cgroup of its own whose quota is its factor times the
CPU time of its threads: with factor 0.3 and 2 threads, 0.6 CPU-seconds per second. The
kernel's CFS bandwidth control enforces the quota (cgroup v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, v2 ``cpu.max``); no maintained Python package wraps it for one
process, and the two files are the whole interface, so it is written here.

The emulation slows a worker's device, not its network: on mixed GPUs the collectives run
over the network at everyone's speed. So the threads the process group starts (gloo's
workers, which run the collectives, and its transport's loop) leave the worker's quota for
a sibling group without one (:func:`free_comm_threads`; cgroup v1, where a single thread
can move; under v2 a thread moves only inside a threaded subtree, and they stay slowed).

The launcher (this process) creates the groups before the workers start and removes them
when they have ended; each worker joins its own group first thing
(:func:`join_own_group`), before it starts any thread. Creating a group needs root and a
mounted cpu controller: without them the run ends in one line before anything starts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from deepjimu.cgroups import Controller, find_controller, join, require, worker_groups, write
from deepjimu.errors import JimuError

__all__ = [
    "ENV",
    "PERIOD_US",
    "CpuController",
    "find_cpu_controller",
    "free_comm_threads",
    "join_own_group",
    "parse_speeds",
    "speed_groups",
    "speeds_problems",
    "thread_ids",
]

ENV = "DEEPJIMU_SPEED_GROUPS"
"""The folder holding the run's groups (``rank<r>`` each), set for the spawned workers."""

COMM = "comm"
"""The group, beside the workers' ``rank<r>``, of their process groups' threads (no quota)."""

PERIOD_US = 50_000
"""The bandwidth period: 50 ms. The kernel's default of 100 ms lets a worker at 0.25 run
25 ms, then stall 75; at 10 ms the throttling itself costs so much that such a worker was
measured at 0.10 of the full-speed one. At 50 ms it measured 0.49 for 0.5 and 0.18 for 0.25
(a ddp and an admm run on the 2-core VM)."""


def parse_speeds(text: str) -> list[float]:
    """The factors of ``--emulate-speeds 1,0.3,...``.

    Raises:
        JimuError: not a comma-separated list of numbers in (0, 1].

    Example:
        >>> parse_speeds("1,0.5")
        [1.0, 0.5]
    """
    try:
        factors = [float(part) for part in text.split(",")]
    except ValueError:
        raise JimuError(
            f"--emulate-speeds takes one factor per worker, like 1,0.3 (emulate-speeds: {text!r})"
        ) from None
    bad = [f for f in factors if not 0 < f <= 1]
    if bad:
        raise JimuError(
            f"--emulate-speeds factors must be in (0, 1], 1 being a worker's full share of "
            f"its cores (emulate-speeds: {text}; out of range: {', '.join(map(_fmt, bad))})"
        )
    return factors


def speeds_problems(text: str, workers: int) -> list[str]:
    """Validation: the one-line problem of ``--emulate-speeds`` for ``workers`` workers."""
    if not text:
        return []
    try:
        factors = parse_speeds(text)
    except JimuError as e:
        return [str(e)]
    if len(factors) != workers:
        return [
            f"--emulate-speeds gives {len(factors)} factor(s) for {workers} worker(s); "
            f"give one per worker (emulate-speeds: {text})"
        ]
    return []


def _fmt(f: float) -> str:
    return f"{f:g}"


CpuController = Controller
"""Where the cpu controller is mounted, and its cgroup version (1 or 2)."""


def find_cpu_controller(mounts: str | None = None) -> Controller | None:
    """The cpu controller's mount (:func:`deepjimu.cgroups.find_controller`)."""
    return find_controller("cpu", mounts)


def _quota(
    controller: Controller, factors: Sequence[float], threads: int
) -> Callable[[Path, int], None]:
    """Sets a worker's group to its factor of ``threads`` cores."""

    def configure(group: Path, rank: int) -> None:
        quota = max(1000, round(factors[rank] * threads * PERIOD_US))  # the kernel's floor: 1 ms
        if controller.version == 1:
            write(group / "cpu.cfs_period_us", str(PERIOD_US))
            write(group / "cpu.cfs_quota_us", str(quota))
        else:
            write(group / "cpu.max", f"{quota} {PERIOD_US}")

    return configure


@contextlib.contextmanager
def speed_groups(
    factors: Sequence[float], threads: int, controller: CpuController | None = None
) -> Iterator[dict[str, str]]:
    """Create one cgroup per worker for the block; yields the environment that tells the
    spawned workers where to find them (:data:`ENV`). Removed afterwards, whatever happened.

    Raises:
        JimuError: no cpu controller is mounted, or the groups cannot be created (not root).
    """
    controller = require(controller or find_cpu_controller(), "cpu", "--emulate-speeds")
    # v1: the quota-free group of the process groups' threads (free_comm_threads) beside
    comm = [COMM] if controller.version == 1 else []
    configure = _quota(controller, factors, threads)
    with worker_groups(
        controller, "cpu", [controller.root], len(factors), configure, "--emulate-speeds", "CPU",
        comm,
    ) as folder:  # fmt: skip
        yield {ENV: str(folder)}


def join_own_group(rank: int) -> None:
    """A spawned worker joins its group (``rank<rank>`` under :data:`ENV`), if the launcher
    made any; every thread it starts afterwards is in the group too."""
    join(ENV, rank, "--emulate-speeds", "CPU")


def thread_ids() -> set[int]:
    """The ids of this process's threads."""
    return {int(t) for t in os.listdir("/proc/self/task")}


def free_comm_threads(before: set[int]) -> None:
    """Move this worker's threads started since ``before`` (:func:`thread_ids` taken just
    before it joined its process group: gloo's workers and its transport's loop) out of its
    quota, into the launcher's :data:`COMM` group, where the launcher made one (cgroup v1)."""
    folder = os.environ.get(ENV)
    tasks = Path(folder) / COMM / "tasks" if folder else None
    if tasks is None or not tasks.exists():
        return
    for tid in sorted(thread_ids() - before):
        try:
            write(tasks, str(tid))
        except ProcessLookupError:  # a thread that has ended since
            continue
        except OSError as e:
            raise JimuError(
                f"--emulate-speeds: a worker cannot move its communication threads to "
                f"{tasks.parent} ({e.strerror or e})"
            ) from None
