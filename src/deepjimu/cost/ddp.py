"""What one ddp step hands to collectives, per ``--compress`` option, and what those messages cost on a cluster.

A step's messages follow from DDP's bucket layout (the gradient shapes of each bucket):
for each bucket, ``none`` all-reduces float32, ``fp16`` / ``bf16`` all-reduce 16-bit
floats, PowerSGD all-reduces the uncompressed tensors, P and Q (torch's
``powerSGD_hook`` split), top-k and QSGD all-gather their payloads. A message's time is
the cluster's ring collective for it (:class:`~deepjimu.cost.cluster.Cluster`), so the
same messages are priced on this machine (from ``jimu probe``'s fits) and on a cluster
that is not here. This is the one cost model of ddp's synchronisation: ``--compress
auto`` (:mod:`deepjimu.cost.compress`) and ``jimu plan`` both price steps through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from deepjimu.compress.payload import qsgd_payload_bytes, topk_k
from deepjimu.cost.cluster import Cluster
from deepjimu.options.compress import parse_compress

__all__ = ["BUCKET", "FIRST_BUCKET", "GRAD_BYTES", "buckets_of", "message_s", "messages"]

FIRST_BUCKET = 1 << 20  # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
BUCKET = 25 << 20  # DDP's bucket_cap_mb default
GRAD_BYTES = 4  # gradients are float32: parameters stay float32 under every --precision
_POWERSGD_MIN_RATE = 2  # torch's PowerSGDState default min_compression_rate

Shape = Sequence[int]


def buckets_of(shapes: Sequence[Shape]) -> list[list[list[int]]]:
    """DDP's bucket layout of parameters of these shapes (model order): the gradients in
    reverse order, the first bucket closed once it holds 1 MiB, the others at 25 MiB.

    Example:
        >>> buckets_of([(4, 2), (4,)])
        [[[4], [4, 2]]]
    """
    out: list[list[list[int]]] = [[]]
    cap, size = FIRST_BUCKET, 0
    for shape in reversed(shapes):
        out[-1].append(list(shape))
        size += GRAD_BYTES * math.prod(shape)
        if size >= cap:
            out.append([])
            cap, size = BUCKET, 0
    return [b for b in out if b]


def messages(option: str, buckets: Sequence[Sequence[Shape]]) -> list[tuple[str, int]]:
    """The collectives (name, bytes per rank) that ``option``'s hook makes in one step past its warm-up.

    Raises:
        ValueError: an option without a message model.
    """
    spec = parse_compress(option)
    out: list[tuple[str, int]] = []
    for shapes in buckets:
        n = sum(math.prod(s) for s in shapes)
        if spec.kind == "none":
            out.append(("all_reduce", GRAD_BYTES * n))
        elif spec.kind in ("fp16", "bf16"):
            out.append((f"all_reduce_{spec.kind}", 2 * n))
        elif spec.kind == "powersgd":
            out.extend(("all_reduce", GRAD_BYTES * k) for k in _powersgd_sizes(shapes, spec.rank))
        elif spec.kind == "topk":  # per tensor: a value and an int32 index per entry sent
            sent = sum(topk_k(math.prod(s), spec.ratio) for s in shapes)
            out.append(("all_gather", sent * (GRAD_BYTES + 4)))
        elif spec.kind == "qsgd":
            out.append(("all_gather", qsgd_payload_bytes(n, spec.bits)))
        else:
            raise ValueError(f"no message model for --compress {option}")
    return out


def message_s(
    cluster: Cluster,
    collective: str,
    nbytes: int,
    p: int,
    measured: Mapping[str, float] | None = None,
) -> float:
    """One message's seconds over ``p`` ranks: as measured at this size (``measured``, keyed
    ``"collective:bytes"``, timed by the probe at its own world), else the cluster's ring."""
    if measured is not None:
        found = measured.get(f"{collective}:{nbytes}")
        if found is not None:
            return found
    if collective.startswith("all_gather"):
        return cluster.all_gather_s(nbytes, p, collective)
    return cluster.all_reduce_s(nbytes, p, collective)


def _powersgd_sizes(shapes: Sequence[Shape], rank: int) -> list[int]:
    """Elements of torch's three all-reduces of a bucket: uncompressed tensors, P, Q (powerSGD_hook's split)."""
    uncompressed = p = q = 0
    for shape in shapes:
        n = shape[0]
        m = math.prod(shape[1:])
        r = min(n, m, rank)
        if (n + m) * r * _POWERSGD_MIN_RATE < n * m:
            p, q = p + n * r, q + m * r
        else:
            uncompressed += n * m
    return [uncompressed, p, q]
