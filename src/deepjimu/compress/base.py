"""What every comm hook here shares: its state (byte counter, group, step count) and the plain all-reduce."""

# no `from __future__ import annotations`: DDP checks a hook's annotations at runtime
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from deepjimu.comm import Comm, nbytes

__all__ = ["HookState", "allreduce_hook", "counted_all_gather", "counted_allreduce"]


class HookState:
    """State of a deepjimu DDP comm hook.

    Args:
        comm: the rank's byte counter; every hook counts the payload it hands to a collective.
        group: the process group (None: the default group).
        start: steps of plain all-reduce before the compressor takes over (its warm-up).

    ``iter`` counts the steps whose last bucket has been handed over; ``last_call`` is when
    the latest bucket was (the ddp strategy times the step's wait from it); ``layout`` holds
    the gradient shapes of each bucket of the last complete step (DDP's bucket layout, which
    the cost model needs); ``decode_s`` sums the time spent decoding the peers' payloads.
    """

    def __init__(self, comm: Comm, group: dist.ProcessGroup | None = None, start: int = 0) -> None:
        self.comm, self.group, self.start = comm, group, start
        self.iter = 0
        self.last_call = 0.0
        self.decode_s = 0.0
        self.layout: dict[int, list[tuple[int, ...]]] = {}
        self._pending: dict[int, list[tuple[int, ...]]] = {}

    @property
    def world(self) -> int:
        """The number of ranks in the hook's group."""
        return dist.get_world_size(self.group)

    @property
    def compressing(self) -> bool:
        """True when the last complete step was past the warm-up."""
        return self.iter > self.start

    def enter(self, bucket: dist.GradBucket) -> bool:
        """Note that DDP handed over ``bucket``; True while the step is still a warm-up step.

        DDP hands over bucket 0 last in every step (``is_last``), so the step count and the
        layout move on there, as in torch's own hook states.
        """
        self.last_call = time.perf_counter()
        warming_up = self.iter < self.start
        self._pending[bucket.index()] = [tuple(g.shape) for g in bucket.gradients()]
        if bucket.is_last():
            self.iter += 1
            self.layout, self._pending = self._pending, {}
        return warming_up


def counted_allreduce(
    state: HookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over the group with torch's ``allreduce_hook``, its payload counted."""
    buf = bucket.buffer()
    state.comm.count(sent=nbytes(buf), recv=nbytes(buf))
    # group None is the default group, as in torch's own callers; its stub says ProcessGroup
    return default_hooks.allreduce_hook(state.group, bucket)  # type: ignore[arg-type]


def counted_all_gather(
    state: HookState, payload: torch.Tensor, world: int
) -> tuple[list[torch.Tensor], torch.futures.Future[list[torch.Tensor]]]:
    """Start an all-gather of every rank's ``payload`` over the group, its bytes counted.

    Each rank sends its payload once and receives ``world`` of them (codes of different
    ranks cannot be summed on the wire, so compressed hooks gather and decode locally).

    Returns:
        the tensors the payloads arrive in, and the future of the collective.
    """
    gathered = [torch.empty_like(payload) for _ in range(world)]
    state.comm.count(sent=nbytes(payload), recv=world * nbytes(payload))
    fut = dist.all_gather(gathered, payload, group=state.group, async_op=True).get_future()
    return gathered, fut


def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: plain all-reduce of the bucket in its own dtype, counted.

    Wrapped by torch's ``fp16_compress_wrapper`` / ``bf16_compress_wrapper`` it receives the
    16-bit buffer, so what it counts is what goes on the wire.
    """
    state.enter(bucket)
    return counted_allreduce(state, bucket)
