"""Sizes as people read them (no torch, no other deepjimu module: anything may import it)."""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: float | None) -> str:
    """``n`` bytes in B / KB / MB / GB (powers of 1024), e.g. ``12.1 MB``; ``-`` for None."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
