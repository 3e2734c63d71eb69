"""Test helper: a made-up play to stand in for Tiny Shakespeare (no test reads ../shared/data)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["TEXT", "put_text"]

TEXT = "".join(
    f"ROMEO {i}:\nAll the world's a stage, and {'ABCDEFGHIJ'[i % 10]} merely players.\n"
    for i in range(80)
)[:4000]
"""4,000 characters."""


def put_text(root: Path, data: bytes) -> Path:
    """``data`` as ``root/shakespeare/input.txt``, where shakespeare-char reads its text."""
    path = root / "shakespeare" / "input.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
