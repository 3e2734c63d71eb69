"""The DDP comm hook of each ``--compress`` option, and local SGD; every payload is counted as it goes on the wire.

fp16, bf16, powersgd and local SGD are torch's own hooks and states
(``torch.distributed.algorithms.ddp_comm_hooks``, ``model_averaging``); topk and qsgd are
written in :mod:`deepjimu.compress.topk` and :mod:`deepjimu.compress.qsgd`, since torch has
none.
"""

# no `from __future__ import annotations`: DDP checks a hook's annotations at runtime
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import (
    default_hooks,
    post_localSGD_hook,
    powerSGD_hook,
)
from torch.distributed.algorithms.model_averaging import averagers
from torch.distributed.algorithms.model_averaging import utils as averaging_utils

from deepjimu.comm import Comm, nbytes
from deepjimu.compress.base import HookState, allreduce_hook
from deepjimu.compress.qsgd import QsgdState, qsgd_hook
from deepjimu.compress.topk import TopkState, topk_hook
from deepjimu.options.compress import CompressSpec

__all__ = ["Averaging", "Hook", "LocalSGDState", "PowerSGDHookState", "comm_hook", "local_sgd_hook"]

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]

# torch's 16-bit hooks are these wrappers around a plain all-reduce; wrapping ours, the
# count sees the 16-bit buffer
_fp16_hook = default_hooks.fp16_compress_wrapper(allreduce_hook)
_bf16_wrapped = default_hooks.bf16_compress_wrapper(allreduce_hook)


def _bf16_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``bf16_compress_wrapper`` around the counted all-reduce.

    DDP refuses a hook *named* ``bf16_compress_wrapper_hook`` unless NCCL >= 2.10 is there,
    but gloo sums bfloat16 too (tests/compress/test_hooks.py), so the hook is called through
    this one, which carries another name.
    """
    return _bf16_wrapped(state, bucket)


class PowerSGDHookState(HookState):
    """:class:`HookState` around torch's ``PowerSGDState`` (which has ``__slots__``, so it cannot carry ours)."""

    def __init__(self, comm: Comm, powersgd: powerSGD_hook.PowerSGDState) -> None:
        super().__init__(comm, powersgd.process_group, powersgd.start_powerSGD_iter)
        self.powersgd = powersgd


def _powersgd_hook(
    state: PowerSGDHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook``, its payload counted.

    In a compressed step torch's hook all-reduces, per bucket, the tensors it leaves
    uncompressed, then P, then Q; its state adds exactly those element counts to
    ``total_numel_after_compression``, so the difference is this bucket's payload.
    """
    state.enter(bucket)
    ps = state.powersgd
    buf = bucket.buffer()
    if ps.iter < ps.start_powerSGD_iter:
        state.comm.count(sent=nbytes(buf), recv=nbytes(buf))
        return powerSGD_hook.powerSGD_hook(ps, bucket)
    before = ps.total_numel_after_compression
    fut = powerSGD_hook.powerSGD_hook(ps, bucket)
    payload = (ps.total_numel_after_compression - before) * buf.element_size()
    state.comm.count(sent=payload, recv=payload)
    if not buf.is_cuda:
        # torch's hook all-reduces P and Q from the callbacks of the previous all-reduce;
        # gloo runs those on its own threads, so with several buckets the ranks could hand
        # the group their collectives in different orders (seen: a size mismatch that
        # aborted a run on mlp:1024x4). Finishing each bucket before the next keeps one order.
        fut.wait()
    return fut


def comm_hook(
    spec: CompressSpec,
    comm: Comm,
    start: int,
    device: torch.device,
    error_feedback: bool = True,
    warm_start: bool = True,
    seed: int = 0,
    group: dist.ProcessGroup | None = None,
) -> tuple[HookState, Hook]:
    """The DDP comm hook of ``spec`` and its state, for ``ddp.register_comm_hook(state, hook)``.

    Args:
        spec: a compressor (not ``auto``: the cost model resolves that first).
        comm: the rank's byte counter.
        start: plain all-reduce steps before powersgd, topk or qsgd take over (powersgd
            with error feedback or warm start needs >= 2: DDP rebuilds its buckets after
            step 1); none, fp16 and bf16 ignore it.
        device: where the gradients are (qsgd draws its random numbers there).
        error_feedback: powersgd, topk: keep what compression left out for the next step.
        warm_start: powersgd: start each step's power iteration from the last step's Q.
        seed: seeds powersgd's random projections and qsgd's rounding.
        group: the process group (None: the default group).

    Example:
        >>> state, hook = comm_hook(parse_compress("fp16"), run.comm, 0, run.device)  # doctest: +SKIP
        >>> ddp.register_comm_hook(state, hook)  # doctest: +SKIP
    """
    if spec.kind == "none":
        return HookState(comm, group), allreduce_hook
    if spec.kind == "fp16":
        return HookState(comm, group), _fp16_hook
    if spec.kind == "bf16":
        return HookState(comm, group), _bf16_hook
    if spec.kind == "powersgd":
        ps = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=spec.rank,
            start_powerSGD_iter=start,
            use_error_feedback=error_feedback,
            warm_start=warm_start,
            random_seed=seed,
        )
        return PowerSGDHookState(comm, ps), _powersgd_hook
    if spec.kind == "topk":
        return TopkState(comm, spec.ratio, error_feedback, start, group), topk_hook
    if spec.kind == "qsgd":
        return QsgdState(comm, spec.bits, seed, device, start, group), qsgd_hook
    raise ValueError(f"no comm hook for {spec}")


class LocalSGDState(HookState):
    """:class:`HookState` around torch's ``PostLocalSGDState``: all-reduce for ``warmup`` steps, then nothing."""

    def __init__(self, comm: Comm, warmup: int, group: dist.ProcessGroup | None = None) -> None:
        super().__init__(comm, group, warmup)
        # no gradient all-reduce after the warm-up: the models are averaged every H steps instead
        self.local = post_localSGD_hook.PostLocalSGDState(
            process_group=group,
            subgroup=None,
            start_localSGD_iter=warmup,
            post_local_gradient_allreduce=False,
        )


def local_sgd_hook(
    state: LocalSGDState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``post_localSGD_hook``, the warm-up's all-reduce counted."""
    state.enter(bucket)
    if state.local.iter < state.local.start_localSGD_iter:
        buf = bucket.buffer()
        state.comm.count(sent=nbytes(buf), recv=nbytes(buf))
    return post_localSGD_hook.post_localSGD_hook(state.local, bucket)


class Averaging:
    """Local SGD's model averaging: torch's ``PeriodicModelAverager``, its all-reduce counted.

    Args:
        comm: the rank's byte counter.
        period: H, steps between averagings.
        warmup: steps of plain gradient all-reduce first (as the hook's ``warmup``).
        group: the process group (None: the default group).
    """

    def __init__(
        self, comm: Comm, period: int, warmup: int, group: dist.ProcessGroup | None = None
    ) -> None:
        self.comm, self.group = comm, group
        self.averager = averagers.PeriodicModelAverager(
            period=period, warmup_steps=warmup, process_group=group
        )

    def after_step(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Call after every optimizer step: averages the parameters every ``period`` steps."""
        params = list(params)
        a = self.averager
        # the averager's own rule (averagers.PeriodicModelAverager.average_parameters)
        if a.step >= a.warmup_steps and (a.step - a.warmup_steps) % a.period == 0:
            self._count(params)
        a.average_parameters(params)

    def average_now(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Collective: average the parameters now (before a checkpoint, and at the end)."""
        params = list(params)
        self._count(params)
        averaging_utils.average_parameters(iter(params), self.group)  # type: ignore[arg-type]

    def _count(self, params: list[torch.nn.Parameter]) -> None:
        # torch flattens the parameters into one tensor and all-reduces it
        payload = sum(nbytes(p) for p in params)
        self.comm.count(sent=payload, recv=payload)
