"""Memory: this process's peak, the machine's available memory, and whether N workers fit in it (a leaf module: the data layer, the run and the launcher use it)."""

from __future__ import annotations

import resource

import torch

from deepjimu.errors import JimuError
from deepjimu.units import format_bytes

__all__ = [
    "WORKERS_SHARE",
    "WORKER_BYTES",
    "available_memory",
    "check_workers_fit",
    "peak_memory_mb",
    "worker_bytes",
]

# what a worker process takes before its model and data: the interpreter, torch and gloo.
# Measured with /proc/<pid>/smaps_rollup on ddp workers of `jimu train --dataset digits`
# (torch 2 on CPU, 2 and 8 workers): 255-285 MB Pss each (345-395 MB Rss, of which about
# 100 MB are library pages every worker shares), so 300 MB with the start-up's peak
WORKER_BYTES = 300 * 2**20
# the share of the available memory a run's workers may take: the rest is the launcher's,
# the system's and the page cache's, since a machine filled to the last page swaps or
# lets the out-of-memory killer end a worker
WORKERS_SHARE = 0.8


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocator peak on a GPU, max RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
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


def worker_bytes(model_bytes: int, data_bytes: int) -> int:
    """An estimate of one worker's memory: :data:`WORKER_BYTES`, the data set it loads
    whole, and its model four times over (weights, gradients, and the optimizer's state:
    two tensors per weight for Adam; DDP's gradient buckets take the place of one).
    """
    return WORKER_BYTES + data_bytes + 4 * model_bytes


def check_workers_fit(workers: int, per_worker: int, available: int | None) -> None:
    """Refuse ``workers`` processes of ``per_worker`` bytes each where they would take more
    than :data:`WORKERS_SHARE` of the ``available`` memory (None: unknown, not checked).

    Raises:
        JimuError: one line with the estimate, the memory available and the most workers
            that fit.

    Example:
        >>> check_workers_fit(64, 300 * 2**20, 16 * 2**30)
        Traceback (most recent call last):
        ...
        deepjimu.errors.JimuError: 64 workers need about 18.8 GB of memory (300.0 MB each: ...
    """
    if available is None:
        return
    room = int(WORKERS_SHARE * available)
    need = workers * per_worker
    if need <= room:
        return
    fit = room // per_worker
    todo = f"give --workers {fit} or fewer" if fit else "free memory first"
    them = "1 worker needs" if workers == 1 else f"{workers} workers need"
    raise JimuError(
        f"{them} about {format_bytes(need)} of memory ({format_bytes(per_worker)} "
        f"each: a process with torch loaded, the data and the model), more than "
        f"{WORKERS_SHARE:.0%} of the {format_bytes(available)} available; {todo}"
    )
