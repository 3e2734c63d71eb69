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

Everything stays on t's device: scale and offset are tensors, and nothing is read back to
the host (each read would wait for the device once per layer per iteration).
"""

from __future__ import annotations

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


# +inf's bit pattern: positive float32 values are ordered like their bits, from 0 (+0.0)
_INF_BITS = 0x7F800000
# the scale search tries _WAYS - 1 patterns at once per round: each round divides the range
# of candidate patterns (below 2^31) by _WAYS = 2^8, so 4 rounds leave a single one
_WAYS, _ROUNDS = 256, 4


def _grid_scale(lo: Tensor, hi: Tensor, levels: int) -> Tensor:
    """The smallest float32 scale s >= 0 with fl(lo + fl(levels * s)) >= hi (0 if hi <= lo).

    The top grid value grows with s, so a search over s's bit patterns in [+0, +inf] finds
    it: a fixed number of rounds of tensor operations, none of which waits for the host.
    Invariant: ``high`` reaches hi, ``low`` does not (or is +0).
    """
    ways = torch.arange(1, _WAYS, device=lo.device)
    low = torch.zeros((), dtype=torch.int64, device=lo.device)
    high = torch.full((), _INF_BITS, dtype=torch.int64, device=lo.device)
    for _ in range(_ROUNDS):
        tries = low + (high - low) * ways // _WAYS
        reaches = torch.mul(tries.to(torch.int32).view(torch.float32), levels).add_(lo) >= hi
        high = torch.where(reaches, tries, high).amin()
        low = torch.where(reaches, low, tries).amax()
    return torch.where(hi > lo, high.to(torch.int32).view(torch.float32), 0.0)


def quantize(
    t: Tensor, bits: int, span: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Map t onto the uniform grid of its own range (or of ``span``) with 2^bits levels.

    Args:
        t: a finite floating-point tensor (computed in float32).
        bits: 8 (uint8 codes) or 16 (int16 codes holding k - 32768).
        span: the (min, max) whose grid to use instead of t's own, 0-dim float32 tensors
            holding t's: the range of a tensor whose rows are split over several ranks
            (``--replicas``), so that every part lies on the grid of the whole.

    Returns:
        (codes, scale, offset): codes with t's shape; scale and offset are 0-dim float32
        tensors on t's device. A constant tensor gets scale 0 and codes 0. A tensor with a
        NaN or an infinity gets a NaN scale, so all its grid values are NaN: refusing it
        here would read the range back to the host; the strategy stops on the NaN
        objective that follows.

    Raises:
        ValueError: if bits is not 8 or 16, or t is empty.

    Example:
        >>> codes, scale, offset = quantize(p, bits=8)
        >>> p_hat = dequantize(codes, scale, offset)
    """
    levels = _levels(bits)
    if t.numel() == 0:
        raise ValueError(f"cannot quantize an empty tensor (shape: {list(t.shape)})")
    x = t.detach().to(torch.float32)
    offset, hi = torch.aminmax(x) if span is None else span
    finite = torch.isfinite(offset) & torch.isfinite(hi)
    scale = torch.where(finite, _grid_scale(offset, hi, levels), torch.nan)
    # a constant tensor (scale 0) gets codes 0, not 0/0
    k = torch.where(scale > 0, (x - offset) / scale, 0.0).round_().clamp_(0, levels)
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


def project(t: Tensor, bits: int, span: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Projection onto the quantization grid: dequantize(quantize(t, bits)), in t's dtype.

    This is the pdADMM-G-Q constraint p in Delta applied after the p-step.

    Args:
        t: a finite floating-point tensor.
        bits: 8 or 16.
        span: as ``quantize``'s.

    Returns:
        The nearest grid values, with t's shape and dtype.

    Raises:
        ValueError: as ``quantize``.
    """
    return dequantize(*quantize(t, bits, span)).to(t.dtype)
