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

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from deepjimu.atomic import atomic_write_text
from deepjimu.balance import balance_problems, parse_balance, partition
from deepjimu.choices import Optimizer
from deepjimu.compress.base import HookState, allreduce_hook
from deepjimu.data import DataSplits
from deepjimu.mesh import batch_problems
from deepjimu.options import DdpOptions, GradientOptions
from deepjimu.run import Run
from deepjimu.strategies.base import GradientStrategy, ProbeStep, make_optimizer, probed_options
from deepjimu.strategies.partition import (
    StagePlan,
    balance_by_size,
    block_shapes,
    staged_metrics,
)

__all__ = ["STAGES_FILE", "ModelParallelStrategy", "bubble_fraction"]

STAGES_FILE = "stages.json"
"""Where rank 0 keeps a timed stage split in the run folder (:meth:`ModelParallelStrategy.plan_stages`)."""


def _kept_sizes(resumed_from: Path | None, stages: int, blocks: int) -> list[int] | None:
    """The stage sizes kept in the run folder a run goes on from, if they fit its stages."""
    kept = resumed_from / STAGES_FILE if resumed_from is not None else None
    if kept is None or not kept.exists():
        return None
    sizes = json.loads(kept.read_text()).get("sizes")
    if not isinstance(sizes, list) or len(sizes) != stages or sum(sizes) != blocks:
        return None
    return [int(s) for s in sizes]


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
        stages = cfg.workers // cfg.replicas * cls.chunks(cfg)
        problems = balance_problems(cfg.balance, n_blocks, stages)
        return problems + batch_problems(cfg.batch_size, cfg.replicas)

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
        broadcasts a timed split, and keeps it in the run folder (:data:`STAGES_FILE`): a
        resumed run takes the split of the run it goes on, whose checkpoint fits it alone."""
        n = run.world * self.chunks(self.cfg)
        how = run.balance
        if how in ("time", "even", "speed"):
            sizes = None
            if run.is_main:
                sizes = _kept_sizes(run.resumed_from, n, len(model))
                if sizes is None:
                    sample = data.train_x[: self.profile_rows(data)].to(run.device)
                    speeds = None
                    if how == "speed" and run.speeds is not None:
                        speeds = [run.speeds[s % run.world] for s in range(n)]
                    sizes = partition(run.measurer.block_costs(model, sample), n, speeds)
                text = json.dumps({"sizes": sizes})
                atomic_write_text(run.out_dir / STAGES_FILE, text)
            sizes = run.broadcast_object(sizes)
            how = "time" if how == "even" else how
        elif how == "size":
            sizes = balance_by_size(model, n)
        else:
            sizes, how = parse_balance(how, len(model), n), "list"
        return StagePlan(tuple(sizes), run.world, how)

    def own_blocks(self, model: nn.Sequential, data: DataSplits, run: Run) -> set[int]:
        """Collective: this rank's stages' blocks, the stage plan made (once) on ``model``'s
        shapes (a split by the blocks' times times a copy of each, one at a time); with
        ``--replicas``, of its replica's chain (:meth:`Run.chain`)."""
        run = run.chain()
        if getattr(self, "plan", None) is None:
            self.shapes = block_shapes(model, data.train_x[:1])
            self.plan = self.plan_stages(model, data, run)
            if run.is_main and not self.cfg.quiet:
                print(self.plan.summary(self.name), flush=True)
        return set(self.plan.blocks_of(run.rank))

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        """This rank's stages, on its replica's chain; with ``--replicas`` each stage module
        is wrapped in torch's DDP over its column (the ranks that hold the same stage), so its
        gradients are averaged over the replicas while the backward pass runs."""
        run = run.chain()
        self.run, self.model = run, model
        self.own_blocks(model, data, run)  # planned already where the worker built our part
        own = set(self.plan.blocks_of(run.rank))
        for b, block in enumerate(model):
            # another rank's blocks are freed: each rank holds and checkpoints only its own
            block.to(run.device if b in own else "meta")
        stages = {s: model[slice(*self.plan.bounds(s))] for s in self.plan.stages_of(run.rank)}
        self.stages = {s: self._replicated(m) for s, m in stages.items()}
        params = [p for stage in stages.values() for p in stage.parameters()]
        self.optimizer = make_optimizer(params, self.cfg) if params else None  # type: ignore[assignment]
        self._busy_s, self._wait_s = 0.0, 0.0
        self._scales: list[float] = []
        self._scale = 1.0

    def _replicated(self, stage: nn.Module) -> nn.Module:
        """``stage`` in torch's DDP over this rank's column, its all-reduces counted (a 1-D
        run's, or a stage without parameters: as it is)."""
        column = self.run.replicas
        if column is None or not any(p.requires_grad for p in stage.parameters()):
            return stage
        ids = [self.run.device.index] if self.run.device.type == "cuda" else None
        ddp = DistributedDataParallel(stage, device_ids=ids, process_group=column.group)
        ddp.register_comm_hook(HookState(column, column.group), allreduce_hook)
        return ddp

    def batches(self, data: DataSplits, epoch: int, run: Run) -> list[tuple[Tensor, Tensor]]:
        """The batches of ``local``; with ``--replicas R``, this replica's part of each (the
        r-th of R nearly equal consecutive parts), its mean loss weighted by R b / B where it
        holds b of the batch's B rows: DDP averages the replicas' gradients, so the average is
        the gradient of the whole batch's mean loss, as in ``local``."""
        out = super().batches(data, epoch, run)
        mesh = self.run.mesh
        if mesh is None:
            return out
        parts, self._scales = mesh.parts(out)
        self._scales.reverse()  # popped in step order
        return parts

    # ---- one step ---------------------------------------------------------------------------
    def train_step(self, x: Tensor, y: Tensor) -> Tensor | None:
        wait0, t0 = self.run.stats.wait_s, time.perf_counter()
        self._scale = self._scales.pop() if self._scales else 1.0
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
            (loss * self._scale if self._scale != 1.0 else loss).backward()
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
        # one replica's chain scores the model (the others hold the same weights)
        chain = self.run
        scores = chain.mesh is None or chain.mesh.replica == 0
        out: dict[str, Any] = (
            staged_metrics(self.model, self.plan, chain, self.shapes, data) if scores else {}
        )
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
        holds each rank's blocks; no rank gathers the whole model); with ``--replicas``,
        replica 0's ranks alone (the others hold copies)."""
        mesh = self.run.mesh
        return self.model if mesh is None or mesh.replica == 0 else None
