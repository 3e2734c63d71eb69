"""Work assignment for strategies that split the model: which rank owns which blocks, and moving them.

The plan is pure (:class:`StagePlan`, over the solver of :mod:`deepjimu.balance`); the
sizing half weighs blocks by their bytes (:func:`balance_by_size`; by time, the run's
measurer times them, :mod:`deepjimu.measure`); the
transport half evaluates a split model by stages (:func:`staged_count_correct`): no rank
holds the whole model (each checkpoints its own blocks).

Messages of :func:`staged_count_correct` are bookkeeping (evaluation), like :meth:`deepjimu.run.Run.gather_objects`: they go through a private
:class:`~deepjimu.comm.Comm` whose counters are discarded, so ``bytes_sent`` / ``wait_s`` of a
run measure training traffic only, comparable with ``local`` and ``ddp`` (whose evaluation
sends nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.balance import partition
from deepjimu.comm import Comm, CommStats
from deepjimu.data import DataSplits
from deepjimu.models.parts import shaped
from deepjimu.run import Run

__all__ = [
    "StagePlan",
    "balance_by_size",
    "block_shapes",
    "staged_count_correct",
    "staged_metrics",
]

Shape = tuple[tuple[int, ...], torch.dtype]


@torch.no_grad()
def block_shapes(model: nn.Sequential, sample: Tensor) -> list[Shape]:
    """Per-sample shape and dtype of the input of every block, then of the output.

    Runs ``sample``'s shape (a batch of one row is enough) through each block for its
    output's shape alone (:func:`~deepjimu.models.parts.shaped`: nothing of the model's size is
    computed or allocated), so a split model's blocks that another rank holds (on the meta
    device here) have their shapes too.

    Returns:
        ``len(model) + 1`` pairs ``(shape without the batch dimension, dtype)``.
    """
    x, shapes = sample.to("meta"), [(tuple(sample.shape[1:]), sample.dtype)]
    for block in model:
        x = shaped(block, x)
        shapes.append((tuple(x.shape[1:]), x.dtype))
    return shapes


def balance_by_size(model: nn.Sequential, k: int) -> list[int]:
    """Stage sizes from the parameter memory of each block (bytes of weights and buffers).

    Returns:
        ``k`` block counts (see :func:`partition`).
    """
    costs = [
        sum(t.numel() * t.element_size() for t in block.state_dict().values()) for block in model
    ]
    return partition(costs, k)


@dataclass(frozen=True)
class StagePlan:
    """Which blocks each stage holds and which rank runs each stage.

    Stage ``s`` holds blocks ``bounds(s)`` and runs on rank ``s % world`` (with more stages than
    ranks, as in interleaved schedules, rank r holds stages r, r + world, ...).

    Example:
        >>> plan = StagePlan((2, 2), world=2, how="time")
        >>> plan.blocks_of(1), plan.summary("pipeline")
        ([2, 3], 'pipeline: 2 stages, blocks [2, 2], balance by time')
    """

    sizes: tuple[int, ...]
    world: int
    how: str

    @property
    def n_stages(self) -> int:
        return len(self.sizes)

    def bounds(self, stage: int) -> tuple[int, int]:
        """Blocks ``[lo, hi)`` of ``stage``."""
        lo = sum(self.sizes[:stage])
        return lo, lo + self.sizes[stage]

    def rank_of(self, stage: int) -> int:
        """The rank that runs ``stage``."""
        return stage % self.world

    def stages_of(self, rank: int) -> list[int]:
        """The stages ``rank`` runs, in order."""
        return list(range(rank, self.n_stages, self.world))

    def blocks_of(self, rank: int) -> list[int]:
        """The block indices ``rank`` owns, in order."""
        return [b for s in self.stages_of(rank) for b in range(*self.bounds(s))]

    def summary(self, name: str) -> str:
        """One line, e.g. ``pipeline: 2 stages, blocks [2, 2], balance by time``."""
        ranks = "1 rank" if self.world == 1 else f"{self.world} ranks"
        per_rank = f" on {ranks}" if self.n_stages != self.world else ""
        stages = "1 stage" if self.n_stages == 1 else f"{self.n_stages} stages"
        return f"{name}: {stages}{per_rank}, blocks {list(self.sizes)}, balance by {self.how}"


def _bookkeeping_comm(run: Run) -> Comm:
    """A Comm over ``run``'s ranks (its replica's, :meth:`Run.chain`) whose counters are
    dropped: checkpoint and evaluation traffic is not training."""
    return Comm(CommStats(), run.comm.group)


@torch.no_grad()  # no graph: evaluation holds no activations for a backward
def staged_count_correct(
    model: nn.Sequential,
    plan: StagePlan,
    run: Run,
    shapes: Sequence[Shape],
    x: Tensor,
    y: Tensor,
    batch: int = 4096,
) -> tuple[int, float, int] | None:
    """Collective: correct predictions, summed cross-entropy and count of the split model.

    Stage s runs its blocks on each chunk of ``x`` and sends the activations to stage s + 1
    (not counted as training traffic); the rank of the last stage scores them against ``y``.
    Every rank passes the same ``x`` and ``y``.

    Args:
        model: the full ``nn.Sequential``; only this rank's blocks are run.
        plan: who owns which block.
        run: this rank's run.
        shapes: :func:`block_shapes` of ``model`` (to size the receive buffers).
        x, y: the samples and labels to score.
        batch: rows per chunk.

    Returns:
        ``(correct, loss_sum, count)`` on the last stage's rank, None elsewhere.
    """
    comm = _bookkeeping_comm(run)
    mine = plan.stages_of(run.rank)
    last = plan.n_stages - 1
    was_training = model.training
    model.eval()
    correct, loss = 0, 0.0
    for xb, yb in zip(x.split(batch), y.split(batch), strict=True):
        # data may live on the host (admm mini-batch mode) while the blocks run on the device
        a, yb = xb.to(run.device), yb.to(run.device)
        for s in mine:
            lo, hi = plan.bounds(s)
            if s > 0 and plan.rank_of(s - 1) != run.rank:
                shape, dtype = shapes[lo]
                a = comm.recv(
                    torch.empty((len(xb), *shape), dtype=dtype, device=run.device),
                    plan.rank_of(s - 1),
                )
            for block in list(model)[lo:hi]:
                a = block(a)
            if s == last:
                correct += int((a.argmax(1) == yb).sum())
                loss += float(F.cross_entropy(a, yb, reduction="sum"))
            elif plan.rank_of(s + 1) != run.rank:
                comm.send(a.contiguous(), plan.rank_of(s + 1))
    model.train(was_training)
    return (correct, loss, y.numel()) if plan.rank_of(last) == run.rank else None


def staged_metrics(
    model: nn.Sequential, plan: StagePlan, run: Run, shapes: Sequence[Shape], data: DataSplits
) -> dict[str, float]:
    """Collective: ``train_acc``, ``val_acc``, ``test_acc``, the training ``loss`` and the
    ``val_loss`` (mean cross-entropy) of the split model, by :func:`staged_count_correct` on each split.

    Returns:
        the figures on the last stage's rank, an empty dict elsewhere.
    """
    out: dict[str, float] = {}
    for split in ("train", "val", "test"):
        x, y = data.eval_split(split)
        if len(y):
            scored = staged_count_correct(model, plan, run, shapes, x, y)
            if scored is not None:
                correct, loss_sum, n = scored
                out[f"{split}_acc"] = correct / n
                if split == "train":
                    out["loss"] = loss_sum / n
                elif split == "val":
                    out["val_loss"] = loss_sum / n
    return out
