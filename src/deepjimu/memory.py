"""Peak memory of this process (a leaf module: the data layer and the run both use it)."""

from __future__ import annotations

import resource

import torch

__all__ = ["peak_memory_mb"]


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocator peak on a GPU, max RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
