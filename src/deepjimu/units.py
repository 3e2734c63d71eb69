"""Sizes as people read them (no torch, no other deepjimu module: anything may import it)."""

from __future__ import annotations

__all__ = ["format_bytes", "parse_size"]


def format_bytes(n: float | None) -> str:
    """``n`` bytes in B / KB / MB / GB (powers of 1024), e.g. ``12.1 MB``; ``-`` for None."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """Bytes of a size as people write it: ``1.5G``, ``512M``, ``2GB``, ``300MiB`` or a
    plain number of bytes; K, M, G and T are powers of 1024, as :func:`format_bytes` prints.

    Raises:
        ValueError: not a positive size.

    Example:
        >>> parse_size("1.5G"), parse_size("512mb"), parse_size("4096")
        (1610612736, 536870912, 4096)
    """
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = s[-1:] if s[-1:] in _UNITS and s[-1:] else ""
    try:
        value = float(s[: len(s) - len(unit)])
    except ValueError:
        raise ValueError("takes a size like 1.5G, 512M or 2GB") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("takes a size like 1.5G, 512M or 2GB, above zero")
    return round(value * _UNITS[unit])
