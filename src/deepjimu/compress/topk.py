"""Top-k sparsification with error feedback, as a DDP comm hook (torch ships none, so it is written here).

Each rank sends, of every tensor of its bucket, the k = ceil(ratio * n) entries of largest
magnitude (values and int32 indices, packed into one byte tensor); the ranks' index sets differ, so the
payloads are all-gathered, not all-reduced, and each rank adds them up. With error
feedback, what a rank did not send is kept and added to its next gradient (Stich et al.,
NeurIPS 2018; Lin et al., Deep Gradient Compression, ICLR 2018).
"""

# no `from __future__ import annotations`: DDP checks a hook's annotations at runtime
import math
import time

import torch
import torch.distributed as dist
from torch import Tensor

from deepjimu.comm import Comm
from deepjimu.compress.base import HookState, counted_all_gather, counted_allreduce
from deepjimu.compress.payload import topk_k

__all__ = ["TopkState", "topk_decode", "topk_encode", "topk_hook", "topk_indices"]


def topk_indices(a: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """Indices of the ``k`` largest entries of ``a`` (>= 0), in no particular order.

    ``torch.topk`` over a whole bucket is slow on CPUs for large k, so, as Deep Gradient
    Compression does, a threshold is first estimated from a random sample: the sample's
    top 1.5 k/n fraction bounds a candidate set that holds the top k with high probability,
    and the exact top k is taken among the candidates (the whole vector when too few pass).
    The result is the exact top k either way; the sample only decides how fast.
    """
    n = a.numel()
    m = math.ceil(256 * n / k)  # about 256 sampled entries above the threshold
    if 8 * k > n or m > n // 4:  # sampling pays for small fractions of large tensors only
        return a.topk(k, sorted=False).indices
    sample = a[torch.randint(n, (m,), generator=generator, device=a.device)]
    threshold = sample.topk(math.ceil(1.5 * k * m / n), sorted=False).values.min()
    candidates = (a >= threshold).nonzero().squeeze(1)
    if candidates.numel() < k:
        return a.topk(k, sorted=False).indices
    return candidates[a[candidates].topk(k, sorted=False).indices]


def topk_encode(
    g: Tensor, sizes: list[int], ratio: float, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """The entries of largest magnitude of each of the consecutive tensors that make up ``g``.

    Each tensor (a layer's weight or bias, ``sizes`` entries each, in ``g``'s order) sends
    its own ``topk_k(size, ratio)`` entries, as Deep Gradient Compression selects per layer:
    over a whole bucket, the layers with the largest gradients would take every slot.

    Returns:
        the payload (the values, then their int32 indices into ``g``, as one byte tensor)
        and the indices.

    Example:
        >>> payload, idx = topk_encode(torch.tensor([0.1, -3.0, 2.0, 5.0]), [3, 1], 0.5)
        >>> topk_decode([payload], 4, torch.float32)
        tensor([ 0., -3.,  2.,  5.])
    """
    a = g.abs()
    parts, offset = [], 0
    for n in sizes:
        parts.append(offset + topk_indices(a[offset : offset + n], topk_k(n, ratio), generator))
        offset += n
    idx = torch.cat(parts)
    payload = torch.cat([g[idx].view(torch.uint8), idx.to(torch.int32).view(torch.uint8)])
    return payload, idx


def topk_decode(payloads: list[Tensor], n: int, dtype: torch.dtype) -> Tensor:
    """The mean over ranks of the sparse vectors in ``payloads`` (each from :func:`topk_encode`), length ``n``."""
    out = torch.zeros(n, dtype=dtype, device=payloads[0].device)
    width = torch.empty(0, dtype=dtype).element_size()
    for p in payloads:
        k = p.numel() // (width + 4)
        values = p[: k * width].view(dtype)
        out.index_add_(0, p[k * width :].view(torch.int32).long(), values)
    return out.div_(len(payloads))


class TopkState(HookState):
    """State of :func:`topk_hook`: the ratio and, with error feedback, each bucket's residual."""

    def __init__(
        self,
        comm: Comm,
        ratio: float,
        error_feedback: bool = True,
        start: int = 0,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(comm, group, start)
        self.ratio, self.error_feedback = ratio, error_feedback
        self.residual: dict[int, Tensor] = {}
        self.generator: torch.Generator | None = (
            None  # topk_indices' sampling, on the gradients' device
        )


def topk_hook(state: TopkState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: all-gather each rank's top-k entries (plain all-reduce during the warm-up)."""
    if state.enter(bucket):
        return counted_allreduce(state, bucket)
    g = bucket.buffer()
    residual = state.residual.get(bucket.index())
    if state.error_feedback and residual is not None and residual.numel() == g.numel():
        g.add_(residual)
    if state.generator is None:
        state.generator = torch.Generator(device=g.device).manual_seed(0)
    sizes = [t.numel() for t in bucket.gradients()]  # the bucket's tensors, in buffer order
    payload, idx = topk_encode(g, sizes, state.ratio, state.generator)
    if state.error_feedback:  # what was not sent waits for the next step
        residual = g.clone()
        residual[idx] = 0
        state.residual[bucket.index()] = residual
    world = state.world
    gathered, fut = counted_all_gather(state, payload, world)

    def decode(_: torch.futures.Future) -> Tensor:
        t0 = time.perf_counter()
        g.copy_(topk_decode(gathered, g.numel(), g.dtype))
        state.decode_s += time.perf_counter() - t0
        return g

    return fut.then(decode)
