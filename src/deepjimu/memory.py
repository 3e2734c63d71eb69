"""Memory: this process's peak, the machine's available memory, and whether a run's workers fit their limits (a leaf module: the data layer, the run and the launcher use it)."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from deepjimu.budget import memory_limit_bytes
from deepjimu.errors import OutOfMemory
from deepjimu.units import format_bytes

__all__ = [
    "MARGIN",
    "WORKERS_SHARE",
    "Limit",
    "available_memory",
    "cap_allocator",
    "check_fit",
    "out_of_memory",
    "peak_memory_mb",
    "return_freed_memory",
]

# the share of the available memory a run's workers may take: the rest is the launcher's,
# the system's and the page cache's, since a machine filled to the last page swaps or
# lets the out-of-memory killer end a worker
WORKERS_SHARE = 0.8

MARGIN = 1.3
"""A worker is refused its budget before it starts only where its predicted peak passes
the budget by more than this factor: the predictions' worst error measured (issue 46's
bound: 30%); nearer the budget the run starts, and the budget itself stops it."""


@dataclass(frozen=True)
class Limit:
    """A memory limit: its bytes, what sets it (one line's words), whether the run's
    workers share it (the machine's memory, a job's cgroup) or each has it (a budget), and
    whether it counts a worker's training state alone (``--memory-limit``: the process's
    start-up is charged before the worker joins its group; a GPU's allocator), not the
    whole process."""

    bytes: int
    what: str
    shared: bool
    state_only: bool = False


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocator peak on a GPU, peak RSS on the CPU.

    On Linux the RSS peak is ``VmHWM`` of ``/proc/self/status``, this process image's own:
    ``getrusage``'s ``ru_maxrss`` survives ``exec``, so a process started by a large one
    (a worker by its launcher, a run by ``jimu plan --check``) reported its parent's peak
    (1,532 MB for one-process runs of 400-800 MB under a plan's check)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def available_memory() -> int | None:
    """Bytes of memory available to new processes (``MemAvailable`` of ``/proc/meminfo``),
    or None where the system does not say (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_fit(
    peaks: Sequence[int], limits: Sequence[Limit], states: Sequence[int] | None = None
) -> None:
    """Refuse workers of predicted ``peaks`` (bytes, one per worker; ``states``: their
    training state alone, default the peaks) where they do not fit ``limits``: a worker
    whose figure passes its own limit by more than :data:`MARGIN`, or workers that together
    would take more than :data:`WORKERS_SHARE` of a shared one.

    Raises:
        JimuError: one line with the prediction, the limit and what would fit.

    Example:
        >>> check_fit([300 * 2**20] * 64, [Limit(16 * 2**30, "the 16.0 GB available", True)])
        Traceback (most recent call last):
        ...
        deepjimu.errors.JimuError: 64 workers need about 18.8 GB of memory (300.0 MB each: ...
    """
    if not peaks:
        return
    largest = max(peaks)
    for limit in sorted(limits, key=lambda x: x.shared):
        figures = list(states if states is not None and limit.state_only else peaks)
        worst = max(range(len(figures)), key=figures.__getitem__)
        if not limit.shared and figures[worst] > MARGIN * limit.bytes:
            counted = "" if limit.state_only else " and the process"
            raise OutOfMemory(
                f"worker {worst} needs about {format_bytes(figures[worst])} of memory (predicted:"
                f" its part of the model, its optimizer state and activations{counted}), "
                f"more than {limit.what} by over the predictions' {MARGIN - 1:.0%} margin; give "
                "a larger budget, or a strategy or worker count that puts less on each worker "
                "(jimu plan --memory-limit shows which fit)"
            )
        room = int(WORKERS_SHARE * limit.bytes)
        if not limit.shared or sum(peaks) <= room:
            continue
        same = len(set(peaks)) == 1
        fit = room // largest if same else 0
        todo = f"give --workers {fit} or fewer" if fit else "free memory first"
        them = "1 worker needs" if len(peaks) == 1 else f"{len(peaks)} workers need"
        each = "" if len(peaks) == 1 else " each" if same else " the largest"
        raise OutOfMemory(
            f"{them} about {format_bytes(sum(peaks))} of memory ({format_bytes(largest)}"
            f"{each}: a process with torch loaded, the data and its part of the model), more "
            f"than {WORKERS_SHARE:.0%} of {limit.what}; {todo}"
        )


def cap_allocator(limit: str, device: torch.device) -> None:
    """``--memory-limit`` on a GPU: cap this process's CUDA allocator at ``limit``."""
    budget = memory_limit_bytes(limit)
    if budget is not None and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)


def out_of_memory(limit: str, device: torch.device, e: Exception) -> OutOfMemory:
    """A device's allocator out of memory (``e``), in one line with the budget and peak."""
    peak = format_bytes(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else "-"
    if limit:
        return OutOfMemory(
            f"passed its memory budget of {format_bytes(memory_limit_bytes(limit))} on "
            f"{device} (--memory-limit; its allocator's peak: {peak}); give a larger budget, "
            "or a strategy or worker count that puts less on each worker"
        )
    first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
    return OutOfMemory(f"{device} ran out of memory (its allocator's peak: {peak}): {first}")


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
FREED_FROM = 1 << 20
"""Allocations of at least this many bytes get their own mapping under
:func:`return_freed_memory`, handed back to the system when freed."""


def return_freed_memory() -> bool:
    """Have glibc's allocator return what a process frees: allocations of
    :data:`FREED_FROM` bytes or more in mappings of their own, and no dynamic threshold.

    glibc raises its threshold to the size of a freed mapping (up to 32 MiB), and serves what
    is smaller from a heap that keeps what is freed: a strategy that gathers every block's
    weights and frees them each step (fsdp) then grew a CPU worker to about twice its state
    (mlp:1024x8, fsdp x2: 761 MB, 407 MB with this; at 197 against 198 samples/s). Not for
    every strategy: ddp, whose buckets are reused, lost 22% of its speed to the page faults
    of fresh mappings. No-op (False) where the C library is not glibc.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, FREED_FROM))
