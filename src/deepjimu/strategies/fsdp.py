"""``fsdp``: fully sharded data parallel with torch's own FSDP2 (``fully_shard``, ZeRO-3).

Every rank holds 1/world of each parameter, of its gradient and of the optimizer's state.
Each block of the ``nn.Sequential`` is its own unit: its parameters are all-gathered just
before its forward (and again before its backward), freed after, and its gradients
reduce-scattered to their owners, so a rank's memory holds the shards and one block at a
time, not the model. The data is sharded as ddp shards it (:class:`DataParallel`), so an
update equals ``local``'s on the same global batch. Every all-gather and reduce-scatter is
counted where FSDP hands it to the process group (:class:`CountedAllGather`,
:class:`CountedReduceScatter`): an all-gather sends its shard and receives world of them, a
reduce-scatter sends its input and receives its shard.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

# FSDP2 takes a custom collective through these interfaces (FSDPModule.set_custom_all_gather
# and set_custom_reduce_scatter); torch keeps them in a private module, so they are imported
# from there: FSDP itself counts no bytes
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)

from deepjimu.comm import Comm, CommStats, nbytes
from deepjimu.data import DataSplits
from deepjimu.memory import return_freed_memory
from deepjimu.models import parse_spec
from deepjimu.options import GradientOptions
from deepjimu.run import Run
from deepjimu.strategies.base import DataParallel, accuracies, count_correct, make_optimizer
from deepjimu.strategies.sharding import ShardedModel, shard_copy, sharded_skeleton

# A GPT's head returns its logits as a view (batch, vocabulary, time: the layout the loss
# takes), and FSDP2 warns at every step that an in-place op on a view would skip its hook;
# nothing here writes into a unit's output, and a copy of the logits would cost their size
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

__all__ = [
    "CountedAllGather",
    "CountedAllReduce",
    "CountedReduceScatter",
    "FSDPStrategy",
    "counted_units",
    "uncounted",
]


class CountedAllGather(DefaultAllGather):
    """FSDP's all-gather of a unit's shards, its payload counted: the shard sent, world
    shards received (``comm`` may be swapped: evaluation's messages are bookkeeping)."""

    def __init__(self, comm: Comm) -> None:
        super().__init__()
        self.comm = comm

    def __call__(
        self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:  # fmt: skip
        self.comm.count(sent=nbytes(input_tensor), recv=nbytes(output_tensor))
        return super().__call__(output_tensor, input_tensor, group, async_op)


class CountedReduceScatter(DefaultReduceScatter):
    """FSDP's reduce-scatter of a unit's gradients, its payload counted: the whole input
    sent, this rank's shard received."""

    def __init__(self, comm: Comm) -> None:
        super().__init__()
        self.comm = comm

    def __call__(
        self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup,
        op: Any, async_op: bool = False,
    ) -> dist.Work:  # fmt: skip
        self.comm.count(sent=nbytes(input_tensor), recv=nbytes(output_tensor))
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


class CountedAllReduce:
    """HSDP's all-reduce of a unit's gradient shards among the replicas (``--replicas``),
    counted by FSDP's all-reduce hook, which receives its result: the shard sent and
    received once (a collective's payload, as :class:`~deepjimu.comm.Comm` counts them)."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def __call__(self, reduce_output: Tensor) -> None:
        self.comm.count(sent=nbytes(reduce_output), recv=nbytes(reduce_output))


Counted = CountedAllGather | CountedReduceScatter | CountedAllReduce


def counted_units(sharded: nn.Module, comm: Comm, all_reduce: bool) -> list[Counted]:
    """Count the collectives of each FSDP unit of ``sharded`` (its blocks and itself) on
    ``comm``: all-gathers, reduce-scatters and, for HSDP (``all_reduce``), the replicas'
    all-reduces. Returns the counters, whose ``comm`` a caller may swap."""
    out: list[Counted] = []
    for unit in [*sharded.children(), sharded]:
        assert isinstance(unit, FSDPModule)
        gather, scatter = CountedAllGather(comm), CountedReduceScatter(comm)
        unit.set_custom_all_gather(gather)
        unit.set_custom_reduce_scatter(scatter)
        out += [gather, scatter]
        if all_reduce:
            reduce = CountedAllReduce(comm)
            unit.set_all_reduce_hook(reduce)
            out.append(reduce)
    return out


@contextlib.contextmanager
def uncounted(counters: list[Counted], comm: Comm) -> Iterator[None]:
    """Inside the block ``counters`` count on a scratch ``Comm`` (evaluation's collectives
    are bookkeeping, as every other strategy's); after it, on ``comm`` again."""
    for c in counters:
        c.comm = Comm(CommStats())
    try:
        yield
    finally:
        for c in counters:
            c.comm = comm


class FSDPStrategy(ShardedModel, DataParallel):
    """Fully sharded data parallel (ZeRO-3) with torch's FSDP2, one unit per block.

    The training copy is sharded before any of it is allocated: a model built in parts
    loads each block into its shards as it is drawn (``ShardedModel.placer``), one built whole is
    copied into them and freed (:mod:`deepjimu.strategies.sharding`); no rank holds the
    whole model, in training or in a checkpoint (each rank writes its shards). Accuracies
    are measured by the sharded model, every rank taking part. With ``--replicas R`` it is
    torch's hybrid sharding (HSDP): each block sharded over the K = workers / R ranks of a
    replica and its gradient shards all-reduced among the R replicas, the data still split
    over all the workers.
    """

    name = "fsdp"
    cfg: GradientOptions

    @classmethod
    def problems(cls, cfg: GradientOptions, n_blocks: int) -> list[str]:
        assert cfg.workers is not None, "defaults not resolved"
        if cfg.batch_size < cfg.workers:
            return [
                f"batch-size must be >= workers for fsdp (batch-size: {cfg.batch_size}, "
                f"workers: {cfg.workers})"
            ]
        if parse_spec(cfg.model).kind == "embed":  # torch's FSDP2 cannot shard it (chunk_cat)
            return [
                f"fsdp shards dense gradients; model {cfg.model}'s embedding has sparse ones "
                "(use ddp, whose --sync-plan sparse sends their rows)"
            ]
        return cls.balance_problems(str(cfg.balance))

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        self.run, self.model = run, model
        self.setup_shards(data, run)
        self.sharded = self.training_copy(model, run)
        self.optimizer = make_optimizer(self.sharded.parameters(), self.cfg)

    @contextlib.contextmanager
    def _uncounted(self) -> Iterator[None]:
        """Inside the block the sharded model's collectives go uncounted: evaluation is
        bookkeeping, as every other strategy's (whose evaluation sends nothing)."""
        with uncounted(self._comms, self.run.comm):
            yield

    def _shard(self, model: nn.Sequential, run: Run, whole: bool) -> nn.Module:
        """The training copy of ``model`` (loaded with its weights where it is built
        ``whole``): each block, then the whole (the root holds what no block does), sharded
        over the ranks' mesh, every unit's collectives counted."""
        if run.device.type == "cpu":  # the gathered blocks freed each step go back at once
            return_freed_memory()
        run.chain()  # collective: the R x K mesh of --replicas (FSDP2 on it: HSDP)
        mesh = run.device_mesh or init_device_mesh(run.device.type, (run.world,))

        def shard(m: nn.Module) -> None:
            for unit in [*m.children(), m]:
                fully_shard(unit, mesh=mesh)

        sharded = (shard_copy if whole else sharded_skeleton)(model, shard, run.device)
        self._comms = counted_units(sharded, run.comm, all_reduce=run.device_mesh is not None)
        return sharded

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.run.autocast():
            loss = F.cross_entropy(self.sharded(x), y)
        (loss * self.next_scale()).backward()
        self.optimizer.step()
        self.run.synchronize()
        return loss

    def evaluate(self, data: DataSplits, run: Run) -> dict[str, float | None]:
        """Collective: accuracies by the sharded model, every rank running the same number of
        forwards (its training shard in as many chunks as the largest shard needs; the
        validation and test splits, whole on every rank); only rank 0 reports them."""
        chunks = max(1, -(-max(self._shards) // 4096))
        with self._uncounted():
            return self._accuracies(data, run, chunks)

    def _accuracies(self, data: DataSplits, run: Run, chunks: int) -> dict[str, float | None]:
        correct, _, n = count_correct(self.sharded, *data.eval_split("train"), chunks=chunks)
        totals = torch.tensor([correct, n], dtype=torch.float64, device=run.device)
        dist.all_reduce(totals)  # bookkeeping: not counted
        out: dict[str, float | None] = {"train_acc": float(totals[0] / totals[1])}
        out |= accuracies(self.sharded, data, ("val", "test"))
        return out if run.is_main else {}
