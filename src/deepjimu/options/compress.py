"""Parse ``--compress`` options (``none``, ``fp16``, ``bf16``, ``powersgd:4``, ``topk:0.01``, ``qsgd:8``, ``auto``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from deepjimu.errors import JimuError

__all__ = ["KINDS", "CompressSpec", "compress_problems", "parse_compress"]

# kind -> the name of its number (defaults: CompressSpec's fields); the other kinds take none
_PARAMS = {"powersgd": "rank", "topk": "ratio", "qsgd": "bits"}
KINDS = ("none", "fp16", "bf16", "powersgd", "topk", "qsgd", "auto")
_HELP = "none, fp16, bf16, powersgd[:RANK], topk[:RATIO], qsgd[:BITS], auto"


@dataclass(frozen=True)
class CompressSpec:
    """A parsed ``--compress`` value: the compressor ``kind`` and its one number.

    ``rank`` (powersgd) is the rank of the low-rank approximation, ``ratio`` (topk) the
    fraction of a bucket's entries sent, ``bits`` (qsgd) the bits per quantised entry.
    """

    kind: str
    rank: int = 4
    ratio: float = 0.01
    bits: int = 8

    def __str__(self) -> str:
        """The canonical spelling, e.g. ``powersgd:4`` (``parse_compress(str(s)) == s``)."""
        if self.kind not in _PARAMS:
            return self.kind
        name = _PARAMS[self.kind]
        return f"{self.kind}:{getattr(self, name):g}"


def parse_compress(text: str) -> CompressSpec:
    """Parse a ``--compress`` value.

    Example:
        >>> parse_compress("powersgd:2")
        CompressSpec(kind='powersgd', rank=2, ratio=0.01, bits=8)
        >>> str(parse_compress("topk"))
        'topk:0.01'

    Raises:
        JimuError: unknown compressor, a number where none is taken, or a number out of
            range (rank < 1, ratio outside (0, 1], bits outside 2..8); the line names the value.
    """
    m = re.fullmatch(r"([a-z0-9]+)(?::(.*))?", text.strip().lower())
    kind = m[1] if m else text
    if m is None or kind not in KINDS:
        raise JimuError(f"unknown compressor {kind!r} (compress: {text}; known: {_HELP})")
    if m[2] is None:
        return CompressSpec(kind)
    if kind not in _PARAMS:
        raise JimuError(f"{kind} takes no number (compress: {text})")
    name = _PARAMS[kind]
    try:
        value = float(m[2]) if name == "ratio" else int(m[2])
    except ValueError:
        want = "a number" if name == "ratio" else "an integer"
        raise JimuError(f"{name} must be {want} (compress: {text})") from None
    if name == "rank" and value < 1:
        raise JimuError(f"rank must be >= 1 (compress: {text})")
    if name == "ratio" and not 0 < value <= 1:
        raise JimuError(f"ratio must be in (0, 1] (compress: {text})")
    if name == "bits" and not 2 <= value <= 8:
        raise JimuError(f"bits must be in 2..8 (compress: {text})")
    return CompressSpec(kind, **{name: value})  # type: ignore[arg-type]  # value has name's type


def compress_problems(text: str) -> list[str]:
    """The problem with a ``--compress`` value as a list of at most one line (for config checks)."""
    try:
        parse_compress(text)
    except JimuError as e:
        return [str(e)]
    return []
