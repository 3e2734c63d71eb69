"""Matmul precision of a run: true float32, TF32 tensor cores, or bfloat16 autocast.

``fp32`` runs every float32 matmul and convolution in IEEE float32 (on CUDA this also turns
off cuDNN's TF32 convolutions, which PyTorch enables by default). ``tf32`` lets CUDA matmuls
and convolutions use TF32 tensor cores (10-bit mantissa inputs, float32 accumulation); it
has no meaning on a CPU. ``bf16`` runs the matmuls of the compute that a strategy wraps in
:func:`autocast` in bfloat16 through ``torch.autocast`` (CPU or CUDA); parameters, optimizer
state and every other tensor stay float32, and evaluation runs in float32.

Only the backend switches of PyTorch's newer API (``fp32_precision``) are used: mixing them
with the legacy ``allow_tf32`` flags makes PyTorch refuse to report the precision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from deepjimu.choices import Precision
from deepjimu.errors import JimuError

__all__ = ["autocast", "check_precision", "matmul_precision"]


def _switches() -> list[Any]:
    """The backend objects whose ``fp32_precision`` decides float32 matmuls and convolutions."""
    return [torch.backends.cuda.matmul, torch.backends.cudnn.conv]  # type: ignore[attr-defined]


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision that ``device`` cannot run.

    Raises:
        JimuError: ``tf32`` on a device that is not CUDA, or an unknown precision.
    """
    if precision not in Precision.spellings():
        raise JimuError(
            f"precision must be one of {', '.join(Precision.spellings())} (got {precision!r})"
        )
    if precision == Precision.TF32 and device.type != "cuda":
        raise JimuError(
            f"--precision tf32 needs a CUDA device (TF32 is a GPU tensor-core mode; this worker "
            f"runs on {device.type}); use fp32 or bf16"
        )


@contextlib.contextmanager
def matmul_precision(precision: str, device: torch.device) -> Iterator[None]:
    """Set the process-wide float32 matmul mode for a run on ``device``; restore it on exit.

    Raises:
        JimuError: as :func:`check_precision`.
    """
    check_precision(precision, device)
    if device.type != "cuda":
        yield
        return
    saved = [s.fp32_precision for s in _switches()]
    try:
        for s in _switches():
            s.fp32_precision = "tf32" if precision == Precision.TF32 else "ieee"
        yield
    finally:
        for s, value in zip(_switches(), saved, strict=True):
            s.fp32_precision = value


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context for a strategy's training compute: bfloat16 autocast for ``bf16``, else none."""
    if precision == Precision.BF16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
