"""``--memory-limit``: a memory budget per worker, enforced by the kernel or the CUDA allocator.

On a CPU each worker runs in a memory cgroup of its own (:mod:`deepjimu.cgroups`; v1
``memory.limit_in_bytes``, v2 ``memory.max``, swap barred), created by the launcher inside
the group it runs in (a Slurm job's, where there is one) before the workers start. A worker
that passes its budget is ended by the kernel's out-of-memory killer, and the launcher
reads that from the group's own counter (``oom_kill`` in ``memory.oom_control`` or
``memory.events``), not from the exit code. On a GPU the worker's CUDA allocator is capped
(``torch.cuda.set_per_process_memory_fraction``) and its out-of-memory error names the
budget.

What a budget holds: memory is charged to the group of the process that allocates it, and
a worker joins its group once started, after its interpreter and torch are loaded (torch's
launcher imports torch before it calls the worker; about 225 MB of its own and 100 MB of
shared libraries on a CPU, which stay charged to the launcher's group: the kernel's v1
``move_charge_at_immigrate`` is deprecated and v2 never moves charges). So the budget holds
what the worker allocates to train: its model, gradients, optimizer state, activations,
buffers and its own copies of data, as a GPU's allocator counts tensors alone. Page cache
counts toward a group's limit and is charged to the group that first reads or writes a page:
the launcher reads the data set and writes the copy the workers map (``DataSplits.save``),
so the data's pages are charged once, to the launcher's group, not to every worker's.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from deepjimu.cgroups import (
    Controller,
    find_controller,
    join,
    own_group,
    require,
    worker_groups,
    write,
)
from deepjimu.units import parse_size

__all__ = [
    "ENV",
    "MemoryGroups",
    "address_limit",
    "group_limit",
    "job_group",
    "join_memory_group",
    "limit_problems",
    "memory_groups",
    "memory_limit_bytes",
    "oom_kills",
]

ENV = "DEEPJIMU_MEMORY_GROUPS"
"""The folder holding the run's memory groups (``rank<r>`` each), set for the workers."""

# a v1 limit this large means none (the kernel's PAGE_COUNTER_MAX, rounded to pages)
_UNLIMITED = 2**62


def memory_limit_bytes(text: str) -> int | None:
    """``--memory-limit``'s bytes (None: no budget); sizes as :func:`parse_size` reads them."""
    return parse_size(text) if text else None


def limit_problems(text: str) -> list[str]:
    """Validation: the one-line problem of ``--memory-limit``."""
    if not text:
        return []
    try:
        size = parse_size(text)
    except ValueError as e:
        return [f"--memory-limit {e} (memory-limit: {text})"]
    if size < 64 * 2**20:
        return [
            f"--memory-limit must be at least 64M: a worker's buffers, its process group's "
            f"and its data's take tens of MB before its model (memory-limit: {text})"
        ]
    return []


@dataclass(frozen=True)
class MemoryGroups:
    """The run's memory groups: one per rank under ``folder``, each limited to ``limit``."""

    controller: Controller
    folder: Path
    limit: int

    def _read(self, rank: int, name: str) -> str | None:
        try:
            return (self.folder / f"rank{rank}" / name).read_text()
        except OSError:
            return None

    def oom_killed(self, rank: int) -> bool:
        """Whether the kernel's out-of-memory killer ended a process of rank ``rank``'s group."""
        return bool(oom_kills(self.folder / f"rank{rank}"))

    def peak(self, rank: int) -> int | None:
        """The most memory rank ``rank``'s group held (None where the kernel does not say)."""
        name = "memory.max_usage_in_bytes" if self.controller.version == 1 else "memory.peak"
        text = (self._read(rank, name) or "").strip()
        return int(text) if text.isdigit() else None


def _limit(controller: Controller, limit: int) -> Callable[[Path, int], None]:
    """Sets a worker's group to ``limit`` bytes, swap barred where swap is accounted."""

    def configure(group: Path, rank: int) -> None:
        if controller.version == 1:
            write(group / "memory.limit_in_bytes", str(limit))
            swap = group / "memory.memsw.limit_in_bytes"  # present where swap is accounted
            if swap.exists():
                write(swap, str(limit))
        else:
            write(group / "memory.max", str(limit))
            swap = group / "memory.swap.max"
            if swap.exists():
                write(swap, "0")

    return configure


@contextlib.contextmanager
def memory_groups(
    limit: int, workers: int, controller: Controller | None = None
) -> Iterator[MemoryGroups]:
    """Create one memory group per worker, each limited to ``limit`` bytes, for the block,
    inside the group this process runs in (a job's), else at the root; removed afterwards,
    whatever happened. The workers find them by :data:`ENV`.

    Raises:
        JimuError: no memory controller is mounted, or the groups cannot be created (not root).
    """
    controller = require(controller or find_controller("memory"), "memory", "--memory-limit")
    parents = [own_group(controller, "memory"), controller.root]
    configure = _limit(controller, limit)
    with worker_groups(
        controller, "memory", parents, workers, configure, "--memory-limit", "memory"
    ) as folder:
        yield MemoryGroups(controller, folder, limit)


def join_memory_group(rank: int) -> None:
    """A spawned worker joins its memory group (``rank<rank>`` under :data:`ENV`), if the
    launcher made any, before it allocates anything."""
    join(ENV, rank, "--memory-limit", "memory")


def address_limit() -> int | None:
    """``RLIMIT_AS`` (``ulimit -v``), which a process's resident memory never passes; None
    where it is not set."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def oom_kills(group: Path) -> int | None:
    """How many processes of memory cgroup ``group`` the kernel's out-of-memory killer has
    ended (``oom_kill`` of v1's ``memory.oom_control``, v2's ``memory.events``); None where
    it does not say."""
    for name in ("memory.oom_control", "memory.events"):
        try:
            text = (group / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def job_group() -> Path | None:
    """The memory cgroup this process runs in (a Slurm job's, a container's), None where
    no memory controller is mounted."""
    controller = find_controller("memory")
    return own_group(controller, "memory") if controller is not None else None


def group_limit(cgroup_file: str | None = None) -> tuple[int, str] | None:
    """The memory limit of the cgroup this process runs in (a Slurm job's, a container's:
    the tightest of its ancestors), which all the workers started here share, and the
    group; None where none is set."""
    controller = find_controller("memory")
    if controller is None:
        return None
    found: list[tuple[int, str]] = []
    group = own_group(controller, "memory", cgroup_file)
    name = "memory.limit_in_bytes" if controller.version == 1 else "memory.max"
    while True:
        with contextlib.suppress(OSError, ValueError):
            text = (group / name).read_text().strip()
            if text != "max" and int(text) < _UNLIMITED:
                found.append((int(text), f"the memory cgroup {group}"))
        if group == controller.root or group.parent == group:
            break
        group = group.parent
    return min(found) if found else None
