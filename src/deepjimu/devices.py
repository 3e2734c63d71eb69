"""Where a worker runs: its device (a GPU per local worker, else the CPU) and a free port for a group of its own."""

from __future__ import annotations

import socket

import torch

from deepjimu.choices import Device
from deepjimu.config import RunConfig
from deepjimu.errors import JimuError

__all__ = ["free_port", "pick_device"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_device(cfg: RunConfig, local_rank: int, local_world: int) -> torch.device:
    """CUDA when asked or available with one GPU per local worker; otherwise the CPU.

    Raises:
        JimuError: ``--device cuda`` without enough GPUs.
    """
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.device == Device.CUDA and n_gpu < local_world:
        raise JimuError(
            f"--device cuda needs one GPU per worker (GPUs: {n_gpu}, workers on this machine: {local_world})"
        )
    if cfg.device == Device.CPU or n_gpu < local_world:
        return torch.device("cpu")
    return torch.device("cuda", local_rank)
