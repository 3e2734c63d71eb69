"""``pipeline``: GPipe / 1F1B / interleaved 1F1B over stages, with torch.distributed.pipelining.

Each mini-batch is cut into m micro-batches that flow through the n stages, so stages work
on different micro-batches at once and the idle share of a step falls from (n - 1) / n to
(n - 1) / (m + n - 1). Stages, balance, per-rank optimizers, evaluation and gathering are the
``model-parallel`` strategy's; only the step differs.

Transparency: an update equals ``local``'s on the same batch. pipelining fixes every
micro-batch's shape at its first step, while batches (``split_steps``) and their micro-batches
differ by a row, so each micro-batch is padded to one size with repeats of its own rows whose
labels are ignored, and each micro-batch loss is ``sum of cross-entropy / rows in the batch``
with ``scale_grads=False``: the micro-batch losses then add up to the batch's mean loss.
(Batch-norm layers see per-micro-batch statistics including the repeats, as in any GPipe.)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining import schedules as pp_schedules

from deepjimu.choices import Optimizer, Schedule
from deepjimu.comm import Comm, Pending, nbytes
from deepjimu.data import DataSplits
from deepjimu.options import DdpOptions, PipelineOptions
from deepjimu.run import Run
from deepjimu.strategies.base import ProbeStep, probed_options
from deepjimu.strategies.model_parallel import ModelParallelStrategy, bubble_fraction

__all__ = ["PROBE_MICROBATCHES", "PipelineStrategy", "counted_p2p"]

PROBE_MICROBATCHES = 4
"""Micro-batches of the pipeline step the probe times (:meth:`PipelineStrategy.probe_step`)."""


_IGNORE = -100  # cross_entropy's ignore_index: the label of a padding row
_SCHEDULES = {
    Schedule.GPIPE: ScheduleGPipe,
    Schedule.ONE_F_ONE_B: Schedule1F1B,
    Schedule.INTERLEAVED: ScheduleInterleaved1F1B,
}


@contextlib.contextmanager
def counted_p2p(comm: Comm) -> Iterator[None]:
    """Count the payload of every message torch.distributed.pipelining sends inside the block.

    The schedules (GPipe, 1F1B and the runtime behind interleaved ones) issue every activation
    and gradient message through ``schedules._batch_p2p`` (directly or via
    ``_sorted_batch_p2p``), which calls ``dist.isend`` / ``dist.irecv`` /
    ``dist.batch_isend_irecv`` and hands the works back to be waited on. pipelining keeps no
    byte counter, so that function is swapped for one that counts each op's tensor and wraps
    each work in :class:`~deepjimu.comm.Pending`, whose ``wait`` counts the time blocked.
    The one-off warm-up vote of the first step (a few int32 tensors) is not counted.
    """
    original = pp_schedules._batch_p2p

    def counting(p2p_ops: list[dist.P2POp], desc: str | None = None) -> list[Any]:
        for op in p2p_ops:
            if op.op is dist.isend:
                comm.count(sent=nbytes(op.tensor))
            else:
                comm.count(recv=nbytes(op.tensor))
        sync = any(op.tensor.is_cuda for op in p2p_ops)
        return [Pending(w, comm.stats, sync) for w in original(p2p_ops, desc=desc)]

    pp_schedules._batch_p2p = counting
    try:
        yield
    finally:
        pp_schedules._batch_p2p = original


class PipelineStrategy(ModelParallelStrategy):
    """Micro-batched pipeline over ``--workers`` ranks (``--schedule``, ``--microbatches``).

    ``interleaved`` gives each rank two stages (rank r runs stages r and r + workers), so it
    needs at least two blocks per rank. The loss of a step is known on the last stage's rank.
    """

    name = "pipeline"
    cfg: PipelineOptions

    @classmethod
    def chunks(cls, cfg: PipelineOptions) -> int:
        return 2 if cfg.schedule == Schedule.INTERLEAVED else 1

    @classmethod
    def problems(cls, cfg: PipelineOptions, n_blocks: int) -> list[str]:
        """Settings the schedules cannot run, one line each.

        A batch smaller than ``--microbatches`` can occur near the end of an epoch only when
        the batch size is close to it; it runs with all-padding micro-batches, so only
        ``--batch-size`` below ``--microbatches`` (never a full micro-batch) is refused.
        """
        w, m, r = cfg.workers, cfg.microbatches, cfg.replicas
        assert w is not None, "defaults not resolved"
        w //= r  # the stages of each replica
        problems = []
        if r == 1 and cfg.batch_size < m:
            problems.append(
                f"batch-size must be >= microbatches (batch-size: {cfg.batch_size}, microbatches: {m})"
            )
        elif cfg.batch_size < m * r:
            problems.append(
                f"batch-size must be >= microbatches x replicas, each replica's share of a "
                f"batch is cut into micro-batches (batch-size: {cfg.batch_size}, "
                f"microbatches: {m}, replicas: {r})"
            )
        if cfg.schedule != Schedule.GPIPE and m < w:
            problems.append(
                f"schedule {cfg.schedule} needs at least one micro-batch per stage "
                f"(microbatches: {m}, stages: {w})"
            )
        if cfg.schedule == Schedule.INTERLEAVED:
            if n_blocks < 2 * w:
                problems.append(
                    f"schedule interleaved needs at least 2 blocks per worker "
                    f"(workers: {w}, blocks in {cfg.model}: {n_blocks})"
                )
            rounds = max(1, m // w)
            if m % rounds:
                problems.append(
                    f"schedule interleaved needs microbatches to be a multiple of "
                    f"microbatches // workers (microbatches: {m}, workers: {w})"
                )
        return problems + super().problems(cfg, n_blocks)

    @classmethod
    def probe_step(
        cls, cfg: DdpOptions, world: int, data: DataSplits, n_blocks: int, rows: int
    ) -> ProbeStep | None:
        """The pipeline's step over the probed ranks, one stage a rank, the model cut as the
        run cuts it: GPipe with :data:`PROBE_MICROBATCHES` micro-batches of the largest
        batch of ``--batch-size`` rows, with the run's optimizer (not K-FAC). From it the
        planner solves the pipelining runtime's own work per action. (A bare GPipe step of
        the same stages, the probe's figure before, timed 5.2-7.0 ms on the 2-core VM
        where training's step of cnn:16-32 took 6-8 ms, and put pipeline predictions
        11-50% above the measured samples/s.)"""
        if n_blocks < world or cfg.optimizer == Optimizer.KFAC:
            return None
        own = probed_options(cfg, cls.name, world)
        m = PROBE_MICROBATCHES
        pcfg = PipelineOptions(**own, schedule=Schedule.GPIPE, microbatches=m)
        if cls.problems(pcfg, n_blocks):
            return None
        pipe = cls(pcfg)
        return ProbeStep(pipe, lambda: m * pipe.rows, lambda: (list(pipe.plan.sizes), pipe.rows, m))

    def profile_rows(self, data: DataSplits) -> int:
        return self.micro_rows(data)

    def micro_rows(self, data: DataSplits) -> int:
        """Rows of every micro-batch: the largest batch's largest micro-batch (of its largest
        replica's part, with ``--replicas``)."""
        largest_batch = math.ceil(data.train_size / self.steps_per_epoch(data))
        largest_part = math.ceil(largest_batch / self.cfg.replicas)
        return math.ceil(largest_part / self.cfg.microbatches)

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        super().setup(model, data, run)
        run = self.run  # this replica's chain
        m, n = self.cfg.microbatches, self.plan.n_stages
        self.rows = self.micro_rows(data)
        self.first = self.plan.rank_of(0) == run.rank
        self.last = self.plan.rank_of(n - 1) == run.rank
        self._pads: dict[int, tuple[Tensor, Tensor]] = {}
        self._batch_rows = 1.0  # rows of the current batch, set by each step for _loss
        stages = []
        for s, module in self.stages.items():
            lo, hi = self.plan.bounds(s)
            # static shapes: no inference pass (it would run a real forward) and no metadata
            # messages; a stage in torch's DDP (--replicas) syncs at its last micro-batch
            stages.append(
                PipelineStage(
                    module,
                    s,
                    n,
                    run.device,
                    input_args=self._example(lo, requires_grad=s > 0),
                    output_args=self._example(hi, requires_grad=True),
                    group=run.comm.group,
                )
            )
        schedule_cls = _SCHEDULES[self.cfg.schedule]
        self.schedule = schedule_cls(
            stages if self.chunks(self.cfg) > 1 else stages[0],  # type: ignore[arg-type]
            m,
            loss_fn=self._loss,
            scale_grads=False,
        )

    def _example(self, boundary: int, requires_grad: bool) -> Tensor:
        shape, dtype = self.shapes[boundary]
        t = torch.empty((self.rows, *shape), dtype=dtype, device=self.run.device)
        return t.requires_grad_(requires_grad and t.is_floating_point())

    def _loss(self, out: Tensor, target: Tensor) -> Tensor:
        # summed over the micro-batch's real rows / rows of the whole batch: the m losses add up
        # to the batch-mean loss of local, so gradients are local's (hence scale_grads=False)
        return (
            F.cross_entropy(out, target, ignore_index=_IGNORE, reduction="sum") / self._batch_rows
        )

    def _padding(self, b: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Row indices into a batch of ``b`` for the m padded micro-batches, and which are padding."""
        if b not in self._pads:
            index, pad = [], []
            for chunk in torch.tensor_split(torch.arange(b), self.cfg.microbatches):
                source = chunk if len(chunk) else torch.arange(b)
                index.append(source[torch.arange(self.rows) % len(source)])
                pad.append(torch.arange(self.rows) >= len(chunk))
            self._pads[b] = (torch.cat(index).to(device), torch.cat(pad).to(device))
        return self._pads[b]

    def forward_backward(self, x: Tensor, y: Tensor) -> Tensor | None:
        index, pad = self._padding(len(y), y.device)
        # a replica's part weighs as R b / B (batches): its losses add up to R b / B times its
        # mean; a sequence's targets (a language model's) count every token
        self._batch_rows = y.numel() / self._scale
        args = (x[index],) if self.first else ()
        kwargs: dict[str, Any] = {"return_outputs": False}
        losses: list[Tensor] = []
        if self.last:
            rows_pad = pad.view(-1, *[1] * (y.dim() - 1))
            kwargs.update(target=y[index].masked_fill(rows_pad, _IGNORE), losses=losses)
        with counted_p2p(self.run.comm):
            self.schedule.step(*args, **kwargs)
        return torch.stack([loss.detach() for loss in losses]).sum() if losses else None

    def bubble_theory(self) -> float:
        return bubble_fraction(self.run.world, self.cfg.microbatches, self.chunks(self.cfg))
