"""What pdADMM's exchange puts on the wire, in bytes: torch-free, so that the planner prices it.

A boundary tensor of ``rows`` samples by ``row_len`` values (a conv layer's [N, C, H, W]:
N rows of C H W) travels as float32, or as its grid's integer codes
(:mod:`~deepjimu.admm_math.quantize`) plus float32 (scale, offset) headers: one pair for
the whole tensor at 8 and 16 bits, one pair per row at 2 and 4 bits, whose codes are packed
8 / bits to a byte. The exchange (``strategies.admm.driver.Exchange``) sends exactly these
bytes; the planner (``cost.predict.admm``) counts them.
"""

from __future__ import annotations

__all__ = ["BITS", "HEADER_BYTES", "ROW_BITS", "per_row", "wire_bytes"]

BITS = (0, 2, 4, 8, 16)
"""The valid ``--quantize`` values (0: float32, no grid)."""
ROW_BITS = (2, 4)
"""Bit widths whose grid is per row (per sample): 3 or 15 steps over a whole tensor's range
would leave most samples' values on one or two levels."""
HEADER_BYTES = 8
"""One grid's float32 (scale, offset)."""


def per_row(bits: int) -> bool:
    """Whether ``bits`` puts each row (sample) on its own grid.

    Example:
        >>> per_row(4), per_row(8)
        (True, False)
    """
    return bits in ROW_BITS


def wire_bytes(rows: int, row_len: int, bits: int) -> int:
    """Bytes on the wire of one exchanged tensor of ``rows`` x ``row_len`` values.

    Args:
        rows: the tensor's first dimension (samples).
        row_len: the number of values per row.
        bits: 0 (float32), 2, 4, 8 or 16.

    Returns:
        float32: 4 per value; else the codes, ``ceil(rows * row_len * bits / 8)`` bytes, plus
        :data:`HEADER_BYTES` per grid (per row at 2 and 4 bits, once at 8 and 16).

    Raises:
        ValueError: if bits is not one of :data:`BITS`.

    Example:
        >>> wire_bytes(3, 5, 0), wire_bytes(3, 5, 8), wire_bytes(3, 5, 4), wire_bytes(3, 5, 2)
        (60, 23, 32, 28)
    """
    if bits not in BITS:
        raise ValueError(f"bits must be 0, 2, 4, 8 or 16 (bits: {bits})")
    values = rows * row_len
    if not bits:
        return 4 * values
    grids = rows if per_row(bits) else 1
    return -(-values * bits // 8) + HEADER_BYTES * grids
