"""Uniform affine quantization of exchanged activations (the pdADMM-G-Q grid Delta).

A tensor t is mapped to integer codes k in [0, 2^bits - 1] on the per-tensor grid
v_k = offset + k * scale, with offset = min(t). Codes travel as 1 byte (8 bits) or
2 bytes (16 bits) per element, plus two float32 scalars.

The grid is chosen so that ``project`` is bit-exactly idempotent: scale is the smallest
float32 whose top grid value fl(offset + fl((2^bits - 1) * scale)) reaches max(t). A
projected tensor then has exactly the same min and top grid value, so quantizing it
again gives the same scale, offset and codes, and sending codes is lossless for grid
values. Dequantization multiplies and adds in two separate float32 operations (no fused
multiply-add) so every device computes the same grid.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = ["dequantize", "project", "quantize"]

_CODE_DTYPES = {8: torch.uint8, 16: torch.int16}
# int16 codes store k - 32768 (torch has no arithmetic on uint16).
_CODE_SHIFT = {8: 0, 16: 32768}


def _levels(bits: int) -> int:
    if bits not in _CODE_DTYPES:
        raise ValueError(f"bits must be 8 or 16 (bits: {bits})")
    return 2**bits - 1


def _top(lo: np.float32, scale: np.float32, levels: int) -> np.float32:
    return np.float32(np.float32(levels) * scale) + lo


def _grid_scale(lo: np.float32, hi: np.float32, levels: int) -> np.float32:
    """The smallest float32 scale s >= 0 with fl(lo + fl(levels * s)) >= hi."""
    if hi <= lo:
        return np.float32(0)
    high = max(
        np.float32((float(hi) - float(lo)) / levels),
        np.float32(np.finfo(np.float32).smallest_subnormal),
    )
    while _top(lo, high, levels) < hi:
        high = np.float32(high * np.float32(2))
    # Positive float32 values are ordered like their bit patterns: bisect on the bits.
    low_bits, high_bits = 0, int(high.view(np.int32))
    while high_bits - low_bits > 1:
        mid = (low_bits + high_bits) // 2
        if _top(lo, np.int32(mid).view(np.float32), levels) >= hi:
            high_bits = mid
        else:
            low_bits = mid
    return np.int32(high_bits).view(np.float32)


def quantize(t: Tensor, bits: int) -> tuple[Tensor, Tensor, Tensor]:
    """Map t onto the uniform grid of its own range with 2^bits levels.

    Args:
        t: a finite floating-point tensor (computed in float32).
        bits: 8 (uint8 codes) or 16 (int16 codes holding k - 32768).

    Returns:
        (codes, scale, offset): codes with t's shape; scale and offset are 0-dim float32
        tensors on t's device. A constant tensor gets scale 0 and codes 0.

    Raises:
        ValueError: if bits is not 8 or 16, t is empty, or t has a NaN or infinity.

    Example:
        >>> codes, scale, offset = quantize(p, bits=8)
        >>> p_hat = dequantize(codes, scale, offset)
    """
    levels = _levels(bits)
    if t.numel() == 0:
        raise ValueError(f"cannot quantize an empty tensor (shape: {list(t.shape)})")
    x = t.detach().to(torch.float32)
    lo_t, hi_t = torch.aminmax(x)
    lo, hi = np.float32(lo_t.item()), np.float32(hi_t.item())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"cannot quantize a tensor with NaN or inf (min: {lo}, max: {hi})")
    s = _grid_scale(lo, hi, levels)
    scale = torch.tensor(float(s), dtype=torch.float32, device=t.device)
    offset = torch.tensor(float(lo), dtype=torch.float32, device=t.device)
    k = torch.zeros_like(x) if s == 0 else torch.round((x - offset) / scale).clamp_(0, levels)
    codes = (k - _CODE_SHIFT[bits]).to(_CODE_DTYPES[bits])
    return codes, scale, offset


def dequantize(codes: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
    """The grid values offset + k * scale of codes made by ``quantize``, as float32.

    Args:
        codes: uint8 (8 bits) or int16 (16 bits) codes.
        scale: 0-dim float32 tensor.
        offset: 0-dim float32 tensor.

    Returns:
        A float32 tensor with the shape of codes.

    Raises:
        ValueError: if codes is neither uint8 nor int16.
    """
    if codes.dtype == torch.uint8:
        k = codes.to(torch.float32)
    elif codes.dtype == torch.int16:
        k = codes.to(torch.float32) + _CODE_SHIFT[16]
    else:
        raise ValueError(f"codes must be uint8 or int16 (dtype: {codes.dtype})")
    return torch.mul(k, scale).add_(offset)


def project(t: Tensor, bits: int) -> Tensor:
    """Projection onto the quantization grid: dequantize(quantize(t, bits)), in t's dtype.

    This is the pdADMM-G-Q constraint p in Delta applied after the p-step.

    Args:
        t: a finite floating-point tensor.
        bits: 8 or 16.

    Returns:
        The nearest grid values, with t's shape and dtype.

    Raises:
        ValueError: as ``quantize``.
    """
    return dequantize(*quantize(t, bits)).to(t.dtype)
