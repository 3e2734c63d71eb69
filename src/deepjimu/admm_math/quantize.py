"""Uniform affine quantization of exchanged activations (the pdADMM-G-Q grid Delta).

A tensor t is mapped to integer codes k in [0, 2^bits - 1] on a uniform grid
v_k = offset + k * scale, offset = min. At 8 and 16 bits one grid spans the whole tensor
and its codes travel as 1 or 2 bytes per element. At 2 and 4 bits each row (a sample: the
first dimension; a conv layer's [N, C, H, W] has N rows of C H W values) has its own grid,
since 3 or 15 steps over a whole tensor's range would leave most samples on one or two
levels, and the codes travel packed, 4 or 2 to a byte (:func:`pack`). Each grid adds two
float32 scalars (``wire.wire_bytes`` counts it all).

At 2 and 4 bits what goes on the grid is a variable's change (:func:`change`): the
neighbour holds the variable's last value, and the new one is that value plus the change
on its grid, which both sides compute alike. A converging iterate's changes shrink, and
their grids with them, so the variables lose no more precision than a step moves: put on
a grid of their own at every iteration, they keep about a sixteenth of their range at 4
bits, which stalls pdADMM (BENCHMARKS.md, section 7).

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

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from deepjimu.admm_math.wire import per_row

__all__ = ["Change", "change", "dequantize", "pack", "project", "quantize", "unpack"]

_CODE_DTYPES = {2: torch.uint8, 4: torch.uint8, 8: torch.uint8, 16: torch.int16}
# int16 codes store k - 32768 (torch has no arithmetic on uint16).
_CODE_SHIFT = {2: 0, 4: 0, 8: 0, 16: 32768}


def _levels(bits: int) -> int:
    if bits not in _CODE_DTYPES:
        raise ValueError(f"bits must be 2, 4, 8 or 16 (bits: {bits})")
    return 2**bits - 1


# +inf's bit pattern: positive float32 values are ordered like their bits, from 0 (+0.0)
_INF_BITS = 0x7F800000
# the scale search tries 2^shift - 1 patterns at once per round and divides the range of
# candidate patterns (below 2^31) by 2^shift: one grid, 256 ways in 4 rounds; a grid per row,
# 16 in 8, so that a round holds [rows, 15] candidates, not [rows, 255]
_SEARCH = {False: (8, 4), True: (4, 8)}


def _grid_scale(lo: Tensor, hi: Tensor, levels: int) -> Tensor:
    """The smallest float32 scale s >= 0 with fl(lo + fl(levels * s)) >= hi (0 if hi <= lo),
    elementwise over lo and hi (0-dim: one grid; [rows]: one per row).

    The top grid value grows with s, so a search over s's bit patterns in [+0, +inf] finds
    it: a fixed number of rounds of tensor operations, none of which waits for the host.
    Invariant: ``high`` reaches hi, ``low`` does not (or is +0).
    """
    shift, rounds = _SEARCH[lo.dim() > 0]
    ways = torch.arange(1, 2**shift, device=lo.device)
    low = torch.zeros_like(lo, dtype=torch.int64)
    high = torch.full_like(lo, _INF_BITS, dtype=torch.int64)
    for _ in range(rounds):
        # (min and max over the last dimension: amin and amax are several times slower there)
        tries = low[..., None] + ((high - low)[..., None] * ways >> shift)
        top = torch.mul(tries.to(torch.int32).view(torch.float32), levels).add_(lo[..., None])
        reaches = top >= hi[..., None]
        high = torch.where(reaches, tries, high[..., None]).min(-1).values
        low = torch.where(reaches, low[..., None], tries).max(-1).values
    return torch.where(hi > lo, high.to(torch.int32).view(torch.float32), 0.0)


def quantize(
    t: Tensor, bits: int, span: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Map t onto the uniform grid of its range (8, 16 bits) or of each row's (2, 4) with
    2^bits levels, rounding to the nearest level.

    Args:
        t: a finite floating-point tensor (computed in float32).
        bits: 2 or 4 (uint8 codes, a grid per row), 8 (uint8 codes) or 16 (int16 codes
            holding k - 32768).
        span: at 8 and 16 bits, the (min, max) whose grid to use instead of t's own, 0-dim
            float32 tensors holding t's: the range of a tensor whose rows are split over
            several ranks (``--replicas``), so that every part lies on the grid of the
            whole. Per-row grids need none.

    Returns:
        (codes, scale, offset): codes with t's shape; scale and offset are float32 tensors on
        t's device, 0-dim (8, 16) or one per row (2, 4: [t.shape[0]], [1] for a tensor of
        fewer than 2 dimensions). A constant tensor (row) gets scale 0 and codes 0. A tensor
        (row) with a NaN or an infinity gets a NaN scale, so all its grid values are NaN:
        refusing it here would read the range back to the host; the strategy stops on the
        NaN objective that follows.

    Raises:
        ValueError: if bits is not 2, 4, 8 or 16, t is empty, or a span comes with a per-row grid.

    Example:
        >>> codes, scale, offset = quantize(p, bits=8)
        >>> p_hat = dequantize(codes, scale, offset)
    """
    levels = _levels(bits)
    if t.numel() == 0:
        raise ValueError(f"cannot quantize an empty tensor (shape: {list(t.shape)})")
    x = t.detach().to(torch.float32)
    if per_row(bits):
        if span is not None:
            raise ValueError(f"a span is for a grid over the whole tensor (bits: {bits})")
        x = x.reshape(t.shape[0] if t.dim() >= 2 else 1, -1)
        offset, hi = torch.aminmax(x, dim=1)
    else:
        offset, hi = torch.aminmax(x) if span is None else span
    finite = torch.isfinite(offset) & torch.isfinite(hi)
    scale = torch.where(finite, _grid_scale(offset, hi, levels), torch.nan)
    columns = (-1, 1) if per_row(bits) else ()  # a row's grid against its values
    s, o = scale.reshape(columns), offset.reshape(columns)
    # a constant tensor (scale 0) gets codes 0, not 0/0
    k = torch.where(s > 0, (x - o) / s, 0.0).round_().clamp_(0, levels)
    codes = (k - _CODE_SHIFT[bits]).to(_CODE_DTYPES[bits]).reshape(t.shape)
    return codes, scale, offset


def dequantize(codes: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
    """The grid values offset + k * scale of codes made by ``quantize``, as float32.

    Args:
        codes: uint8 (2, 4, 8 bits) or int16 (16 bits) codes.
        scale: float32, 0-dim (one grid) or one per row of codes.
        offset: float32, shaped as scale.

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
    if scale.dim() > 0:  # a grid per row
        shape = (-1, *[1] * (codes.dim() - 1)) if codes.dim() >= 2 else ()
        scale, offset = scale.reshape(shape), offset.reshape(shape)
    return torch.mul(k, scale).add_(offset)


def project(t: Tensor, bits: int, span: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Projection onto the quantization grid: dequantize(quantize(t, bits)), in t's dtype.

    This is the pdADMM-G-Q constraint p in Delta applied after the p-step.

    Args:
        t: a finite floating-point tensor.
        bits: 2, 4, 8 or 16.
        span: as ``quantize``'s.

    Returns:
        The nearest grid values, with t's shape and dtype.

    Raises:
        ValueError: as ``quantize``.
    """
    return dequantize(*quantize(t, bits, span)).to(t.dtype)


class Change(NamedTuple):
    """A tensor's change on its grid (:func:`change`): what crosses a boundary at 2 and 4 bits."""

    codes: Tensor
    scale: Tensor
    offset: Tensor

    def apply(self, ref: Tensor) -> Tensor:
        """``ref`` plus the change, in ref's dtype: the new value, which the sender and the
        receiver (holding the same ``ref``) compute bit for bit alike."""
        return ref + dequantize(self.codes, self.scale, self.offset).to(ref.dtype)


def change(ref: Tensor, new: Tensor, bits: int) -> Change:
    """The change from ``ref`` to ``new`` on its own grid (per row at 2 and 4 bits):
    ``change(ref, new, bits).apply(ref)`` is ``new`` up to half a step of that grid.

    Args:
        ref: the value the receiver holds.
        new: the value to send, of ref's shape.
        bits: 2, 4, 8 or 16.

    Returns:
        the change's codes and grid.

    Raises:
        ValueError: as ``quantize``.

    Example:
        >>> c = change(q_old, q_new, 4)
        >>> q = c.apply(q_old)  # and the neighbour: c.apply(its copy of q_old)
    """
    return Change(*quantize(new - ref, bits))


def _slots(bits: int, device: torch.device) -> Tensor:
    """Each code's shift in its byte, made on ``device`` (a copy there would wait for it)."""
    if bits not in (2, 4):
        raise ValueError(f"only 2- and 4-bit codes are packed (bits: {bits})")
    return torch.arange(0, 8, bits, dtype=torch.uint8, device=device)


def pack(codes: Tensor, bits: int) -> Tensor:
    """2- or 4-bit codes packed 8 / bits to a byte, in order, the first in the lowest bits.

    Args:
        codes: uint8 codes below 2^bits, any shape (flattened; the last byte is padded with
            zero codes where the count is not a multiple of 8 / bits).
        bits: 2 or 4.

    Returns:
        A 1-dim uint8 tensor of ``ceil(codes.numel() * bits / 8)`` bytes.

    Raises:
        ValueError: if bits is not 2 or 4.

    Example:
        >>> pack(torch.tensor([1, 2, 3], dtype=torch.uint8), 4)
        tensor([33,  3], dtype=torch.uint8)
    """
    shifts = _slots(bits, codes.device)
    flat = codes.reshape(-1)
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % len(shifts))])
    return (flat.view(-1, len(shifts)) << shifts).sum(dim=1, dtype=torch.uint8)


def unpack(packed: Tensor, bits: int, shape: Sequence[int]) -> Tensor:
    """The codes of a tensor of ``shape`` that :func:`pack` packed.

    Args:
        packed: uint8 bytes from :func:`pack`.
        bits: 2 or 4.
        shape: the codes' shape.

    Returns:
        uint8 codes of ``shape``.

    Raises:
        ValueError: if bits is not 2 or 4.
    """
    shifts = _slots(bits, packed.device)
    codes = (packed.reshape(-1, 1) >> shifts) & (2**bits - 1)
    return codes.reshape(-1)[: math.prod(shape)].reshape(tuple(shape))
