"""``model-parallel``: the model's blocks split over workers, run one stage after the other (the naive baseline).

Stage i receives its input activations from rank i - 1, runs its blocks and sends the output
to rank i + 1; the last rank computes the loss; gradients travel back the same way. With no
micro-batching only one rank computes at any time, so each rank idles for a fraction
(n - 1) / n of a step: that is the bubble the ``pipeline`` strategy shrinks.

:class:`ModelParallelStrategy` also holds what every split-model strategy shares (the stage
plan, per-rank optimizer, staged evaluation, gathering the model, idle-time bookkeeping);
``pipeline`` extends it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.balance import balance_problems, parse_balance, partition
from deepjimu.choices import Optimizer
from deepjimu.data import DataSplits
from deepjimu.options import DdpOptions, GradientOptions
from deepjimu.run import Run
from deepjimu.strategies.base import GradientStrategy, ProbeStep, make_optimizer, probed_options
from deepjimu.strategies.partition import (
    StagePlan,
    balance_by_size,
    block_shapes,
    staged_metrics,
)

__all__ = ["ModelParallelStrategy", "bubble_fraction"]


def bubble_fraction(n: int, m: int, v: int = 1) -> float:
    """Theoretical idle fraction of a fill-drain pipeline: (n - 1) / (v m + n - 1).

    Args:
        n: pipeline ranks.
        m: micro-batches per step (1: no micro-batching).
        v: stages per rank (interleaved schedules).

    Example:
        >>> round(bubble_fraction(4, 4), 3)
        0.429
    """
    return (n - 1) / (v * m + n - 1)


class ModelParallelStrategy(GradientStrategy):
    """Blocks split over the workers as contiguous stages (``--balance``), one batch at a time.

    Every rank holds the whole dataset and takes the same batches as ``local``; the first rank
    feeds the inputs, the last one knows the labels. Each rank's optimizer covers only its
    own blocks. Evaluation runs the same stages forward (uncounted bookkeeping messages).
    """

    name = "model-parallel"

    @classmethod
    def chunks(cls, cfg: Any) -> int:
        """Stages per rank (1 here; interleaved pipelines hold several)."""
        return 1

    @classmethod
    def problems(cls, cfg: Any, n_blocks: int) -> list[str]:
        assert cfg.workers is not None, "defaults not resolved"
        stages = cfg.workers * cls.chunks(cfg)
        return balance_problems(cfg.balance, n_blocks, stages)

    @classmethod
    def probe_step(
        cls, cfg: DdpOptions, world: int, data: DataSplits, n_blocks: int, rows: int
    ) -> ProbeStep | None:
        """The chain's step over the probed ranks, one stage a rank, the model cut as the
        run cuts it (its resolved ``--balance``), the largest batch of ``--batch-size`` rows
        through the stages one after the other, with the run's optimizer (not K-FAC, which
        it does not take); from it the planner solves a hand-off's cost beyond its send."""
        if n_blocks < world or cfg.optimizer == Optimizer.KFAC:
            return None
        chain = cls(GradientOptions(**probed_options(cfg, cls.name, world)))
        batch = math.ceil(data.train_size / chain.steps_per_epoch(data))
        return ProbeStep(chain, lambda: batch, lambda: (list(chain.plan.sizes), batch, 1))

    # ---- setup ------------------------------------------------------------------------------
    def profile_rows(self, data: DataSplits) -> int:
        """Rows of the sample that ``--balance time`` profiles: what one stage runs at once."""
        return min(self.cfg.batch_size, data.train_size)

    def plan_stages(self, model: nn.Sequential, data: DataSplits, run: Run) -> StagePlan:
        """The stage plan of ``--balance`` (``auto`` resolved, :mod:`deepjimu.measure.speeds`): by
        the blocks' measured time (``time``, ``even``), over the ranks' speeds (``speed``:
        stage s runs on rank s % world), by size, or as listed. Rank 0 measures and
        broadcasts a timed split."""
        n = run.world * self.chunks(self.cfg)
        how = run.balance
        if how in ("time", "even", "speed"):
            sizes = None
            if run.is_main:
                sample = data.train_x[: self.profile_rows(data)].to(run.device)
                speeds = None
                if how == "speed" and run.speeds is not None:
                    speeds = [run.speeds[s % run.world] for s in range(n)]
                sizes = partition(run.measurer.block_costs(model, sample), n, speeds)
            sizes = run.broadcast_object(sizes)
            how = "time" if how == "even" else how
        elif how == "size":
            sizes = balance_by_size(model, n)
        else:
            sizes, how = parse_balance(how, len(model), n), "list"
        return StagePlan(tuple(sizes), run.world, how)

    def own_blocks(self, model: nn.Sequential, data: DataSplits, run: Run) -> set[int]:
        """Collective: this rank's stages' blocks, the stage plan made (once) on ``model``'s
        shapes (a split by the blocks' times times a copy of each, one at a time)."""
        if getattr(self, "plan", None) is None:
            self.shapes = block_shapes(model, data.train_x[:1])
            self.plan = self.plan_stages(model, data, run)
            if run.is_main and not self.cfg.quiet:
                print(self.plan.summary(self.name), flush=True)
        return set(self.plan.blocks_of(run.rank))

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        self.run, self.model = run, model
        self.own_blocks(model, data, run)  # planned already where the worker built our part
        own = set(self.plan.blocks_of(run.rank))
        for b, block in enumerate(model):
            # another rank's blocks are freed: each rank holds and checkpoints only its own
            block.to(run.device if b in own else "meta")
        self.stages = {s: model[slice(*self.plan.bounds(s))] for s in self.plan.stages_of(run.rank)}
        params = [p for stage in self.stages.values() for p in stage.parameters()]
        self.optimizer = make_optimizer(params, self.cfg) if params else None  # type: ignore[assignment]
        self._busy_s, self._wait_s = 0.0, 0.0

    # ---- one step ---------------------------------------------------------------------------
    def train_step(self, x: Tensor, y: Tensor) -> Tensor | None:
        wait0, t0 = self.run.stats.wait_s, time.perf_counter()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward(x, y)
        if self.optimizer is not None:
            self.optimizer.step()
        self._busy_s += time.perf_counter() - t0
        self._wait_s += self.run.stats.wait_s - wait0
        return loss

    def forward_backward(self, x: Tensor, y: Tensor) -> Tensor | None:
        """Forward through the stages, loss on the last rank, gradients back; returns the loss there."""
        run, comm, s = self.run, self.run.comm, self.run.rank
        last = self.plan.n_stages - 1
        lo, _ = self.plan.bounds(s)
        if s == 0:
            a = x
        else:
            shape, dtype = self.shapes[lo]
            buf = torch.empty((len(y), *shape), dtype=dtype, device=run.device)
            a = comm.recv(buf, s - 1).requires_grad_()
        out = self.stages[s](a)
        loss = None
        if s == last:
            loss = F.cross_entropy(out, y)
            loss.backward()
        else:
            comm.send(out.detach(), s + 1)
            out.backward(comm.recv(torch.empty_like(out), s + 1))
        if s > 0:
            assert a.grad is not None
            comm.send(a.grad, s - 1)
        return loss

    # ---- what the engine asks for -------------------------------------------------------------
    def bubble_theory(self) -> float:
        """The idle fraction the schedule predicts for equal stage times."""
        return bubble_fraction(self.run.world, 1)

    def evaluate(self, data: DataSplits, run: Run) -> dict[str, Any]:
        """Collective: accuracies by a staged forward, plus the measured and theoretical idle fraction.

        ``idle_frac`` is the time a rank waited on messages over its time in training steps
        since the last event, averaged over ranks (``idle_frac_per_rank`` lists them);
        ``bubble_theory`` is the schedule's prediction for equal stages.
        """
        out: dict[str, Any] = staged_metrics(self.model, self.plan, run, self.shapes, data)
        out.pop("loss", None)  # the loss of a gradient strategy is its training-step mean
        idle = self._wait_s / self._busy_s if self._busy_s else None
        self._busy_s, self._wait_s = 0.0, 0.0
        per_rank = run.gather_objects(idle)
        if run.is_main and None not in per_rank:
            out["idle_frac"] = round(sum(per_rank) / len(per_rank), 6)
            out["idle_frac_per_rank"] = [round(v, 6) for v in per_rank]
            out["bubble_theory"] = round(self.bubble_theory(), 6)
            out["stage_blocks"] = list(self.plan.sizes)
        return out

    def rank_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict() if self.optimizer is not None else None}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def full_model(self, run: Run) -> nn.Module | None:
        """Every rank's model: its own blocks, the others on the meta device (the checkpoint
        holds each rank's blocks; no rank gathers the whole model)."""
        return self.model
