"""The one way deepjimu times work: one call with the device synchronised, the median of a few, the slowest rank's."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

__all__ = ["median_s", "slowest", "timed_runs", "timed_s"]


def timed_s(run: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of ``run()``, the device synchronised after it (so that queued
    GPU work counts).

    Example:
        >>> timed_s(lambda: None, torch.device("cpu")) >= 0
        True
    """
    t0 = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def timed_runs(
    run: Callable[[], object], repeats: int, device: torch.device, warm: int = 1
) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``run()`` after ``warm`` untimed ones
    (allocations, kernels, connections).

    Example:
        >>> len(timed_runs(lambda: None, 3, torch.device("cpu")))
        3
    """
    for _ in range(warm):
        timed_s(run, device)
    return [timed_s(run, device) for _ in range(repeats)]


def median_s(run: Callable[[], object], repeats: int, device: torch.device, warm: int = 1) -> float:
    """Median seconds of ``run()`` over ``repeats`` calls after ``warm`` untimed ones
    (:func:`timed_runs`)."""
    return statistics.median(timed_runs(run, repeats, device, warm))


def slowest(values: Sequence[float], device: torch.device) -> list[float]:
    """Collective: each value's maximum over the ranks of the default group, so that every
    rank holds the same figures (bookkeeping: not counted as training traffic)."""
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t.tolist()]
