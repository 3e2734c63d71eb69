"""What the compressors put on the wire, in bytes: their payload sizes, torch-free, so that the cost models price them.

The codecs (:mod:`~deepjimu.compress.topk`, :mod:`~deepjimu.compress.qsgd`) build exactly
these payloads; the cost model of ddp's messages (:mod:`deepjimu.cost.ddp`) counts them.
"""

from __future__ import annotations

import math

__all__ = [
    "CHUNK",
    "COUNT_BYTES",
    "FUSE_BYTES",
    "fuses",
    "qsgd_payload_bytes",
    "qsgd_slot",
    "topk_k",
]

CHUNK = 512  # entries per norm: QSGD's bucket size d
FUSE_BYTES = 1 << 20
"""A sync plan's all-reduced tensors smaller than this (DDP's first bucket) go in one fused
all-reduce at the end of the backward pass, as DDP buckets them."""
COUNT_BYTES = 8
"""One rank's int64 row count, all-gathered first by the sparse method (by hand or gloo's)."""


def fuses(sparse: bool, numel: int) -> bool:
    """Whether a sync plan's all-reduce of a float32 gradient of ``numel`` entries goes in the
    fused message: a dense one under :data:`FUSE_BYTES`.

    Example:
        >>> fuses(False, 1000), fuses(True, 1000), fuses(False, 10**6)
        (True, False, False)
    """
    return not sparse and 4 * numel < FUSE_BYTES


def qsgd_slot(bits: int) -> int:
    """Wire bits per QSGD code: 2, 4 or 8 (so that a byte holds a whole number of codes)."""
    return 2 if bits <= 2 else 4 if bits <= 4 else 8


def qsgd_payload_bytes(n: int, bits: int) -> int:
    """Bytes of QSGD's payload of a vector of ``n`` entries: packed codes, then one float32
    norm per chunk.

    Example:
        >>> qsgd_payload_bytes(1000, 8)
        1032
    """
    chunks = -(-n // CHUNK)
    return chunks * CHUNK * qsgd_slot(bits) // 8 + 4 * chunks


def topk_k(n: int, ratio: float) -> int:
    """Entries top-k sends of a tensor of ``n``: ``ceil(ratio * n)``, at least 1."""
    return max(1, math.ceil(ratio * n))
