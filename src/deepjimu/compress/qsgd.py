"""QSGD: stochastic rounding to 2..8-bit integer codes, as a DDP comm hook (torch ships none, so it is written here).

Alistarh et al., NeurIPS 2017: a vector v is cut into chunks of d = 512 entries (QSGD's
"bucket size"); each chunk is sent as its norm ||v|| (float32) and one code per entry,
sign(v_i) * l_i with l_i in 0..s, s = 2^(bits-1) - 1, where l_i rounds s |v_i| / ||v|| up
or down at random with the probabilities that make the code unbiased. The codes go on the
wire as unsigned integers (code + s) packed into 2-, 4- or 8-bit slots (bits rounded up to
the next of those). Scales differ per rank, so the payloads are all-gathered and each rank
decodes and averages them.
"""

# no `from __future__ import annotations`: DDP checks a hook's annotations at runtime
import time
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from deepjimu.admm_math.quantize import pack, unpack
from deepjimu.comm import Comm
from deepjimu.compress.base import HookState, counted_all_gather, counted_allreduce
from deepjimu.compress.payload import CHUNK, qsgd_slot

__all__ = ["QsgdState", "qsgd_decode", "qsgd_encode", "qsgd_hook"]


def qsgd_encode(v: Tensor, bits: int, generator: torch.Generator) -> Tensor:
    """Quantise the float32 vector ``v`` to ``bits``-bit codes with stochastic rounding.

    Returns:
        the payload: packed codes, then the chunks' norms, as one byte tensor of
        :func:`~deepjimu.compress.payload.qsgd_payload_bytes` bytes.

    Example:
        >>> v = torch.tensor([0.5, -0.25, 0.0])
        >>> [round(x, 2) for x in qsgd_decode(qsgd_encode(v, 8, torch.Generator()), 3, 8).tolist()]
        [0.5, -0.25, 0.0]
    """
    s = 2 ** (bits - 1) - 1
    n = v.numel()
    x = F.pad(v, (0, -n % CHUNK)).view(-1, CHUNK)
    norms = x.norm(dim=1)
    scaled = x.abs().mul_((s / norms.clamp_min(torch.finfo(v.dtype).tiny))[:, None])
    # floor(a + u), u uniform in [0, 1): a's integer part, plus one with probability frac(a)
    levels = scaled.add_(torch.rand(scaled.shape, generator=generator, device=v.device)).floor_()
    levels.clamp_(max=s)  # |v_i| = ||v|| may round a hair above s
    codes = levels.copysign_(x).add_(s).to(torch.uint8).view(-1)
    slot = qsgd_slot(bits)
    if slot < 8:
        codes = pack(codes, slot)
    return torch.cat([codes, norms.view(torch.uint8)])


def qsgd_decode(payload: Tensor, n: int, bits: int) -> Tensor:
    """The float32 vector of ``n`` entries that ``payload`` (from :func:`qsgd_encode`) stands for."""
    s = 2 ** (bits - 1) - 1
    chunks = -(-n // CHUNK)
    slot = qsgd_slot(bits)
    codes, norms = payload[: chunks * CHUNK * slot // 8], payload[chunks * CHUNK * slot // 8 :]
    if slot < 8:
        codes = unpack(codes, slot, (chunks * CHUNK,))
    levels = codes.view(-1, CHUNK).to(torch.float32) - s
    return (levels * (norms.view(torch.float32) / s)[:, None]).view(-1)[:n]


class QsgdState(HookState):
    """State of :func:`qsgd_hook`: the bits and this rank's random generator (seeded per rank)."""

    def __init__(
        self,
        comm: Comm,
        bits: int,
        seed: int,
        device: torch.device,
        start: int = 0,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(comm, group, start)
        self.bits = bits
        # each rank rounds with its own numbers, so that the ranks' rounding errors are independent
        rank = dist.get_rank(group)
        self.generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + rank)


def qsgd_hook(state: QsgdState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: all-gather each rank's QSGD codes (plain all-reduce during the warm-up)."""
    if state.enter(bucket):
        return counted_allreduce(state, bucket)
    g = bucket.buffer()
    payload = qsgd_encode(g, state.bits, state.generator)
    world = state.world
    gathered, fut = counted_all_gather(state, payload, world)

    def decode(_: torch.futures.Future) -> Tensor:
        t0 = time.perf_counter()
        total = sum(qsgd_decode(p, g.numel(), state.bits) for p in gathered)
        g.copy_(cast(Tensor, total)).div_(world)  # a sum of tensors, not the start value 0
        state.decode_s += time.perf_counter() - t0
        return g

    return fut.then(decode)
