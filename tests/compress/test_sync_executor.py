"""The sync-plan executor: every method delivers DDP's all-reduced gradient and sends the bytes the planner predicts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from deepjimu.comm import Comm, CommStats
from deepjimu.compress.sync import SyncExecutor
from deepjimu.cost.sync import METHODS, TensorInfo, applicable, method_messages
from deepjimu.models.embed import TokenBag
from distributed import distributed_test

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow

VOCAB, DIM, BAG = 40, 6, 5


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        TokenBag(VOCAB, DIM, mode="mean", sparse=True),
        nn.Linear(DIM, 7),
        nn.ReLU(),
        nn.Linear(7, 3),
    )


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's batch: 3 + r rows (uneven, so that SFB pads), its own tokens."""
    g = torch.Generator().manual_seed(100 + rank)
    rows = 3 + rank
    x = torch.randint(0, VOCAB // 2, (rows, BAG), generator=g).float()
    return x, torch.randint(0, 3, (rows,), generator=g)


def _dense(g: torch.Tensor) -> torch.Tensor:
    return g.to_dense() if g.is_sparse else g


@distributed_test(world_size=[2, 3], preload=["torch._dynamo"])
def test_each_method_gives_ddps_gradient_and_counts_the_planned_bytes(
    rank: int, world: int
) -> None:
    x, y = _batch(rank)
    ddp = DistributedDataParallel(_model())
    F.cross_entropy(ddp(x), y).backward()
    want = {n: _dense(p.grad) for n, p in ddp.module.named_parameters()}
    rows = 3 + world - 1  # the busiest rank's batch
    # sparse rows both ways: gloo's own sparse all-reduce (native) and all-gathered by hand
    for method, native in [*((m, False) for m in METHODS), ("sparse", True)]:
        model = _model()
        kinds = {"0.weight": "embedding", "1.weight": "linear", "3.weight": "linear"}
        methods = {
            n: method
            if method in applicable(TensorInfo(n, tuple(p.shape), kinds.get(n, "dense")))
            else "allreduce"
            for n, p in model.named_parameters()
        }
        comm = Comm(CommStats())
        factor_rows = {n: rows for n in kinds if n != "0.weight"}
        sync = SyncExecutor(model, methods, comm, factor_rows, native=native)
        for _ in range(2):  # a second step: nothing of the first is left behind
            model.zero_grad(set_to_none=True)
            sent = comm.stats.bytes_sent
            F.cross_entropy(model(x), y).backward()
            sync.finish()
            for n, p in model.named_parameters():
                torch.testing.assert_close(_dense(p.grad), want[n], msg=f"{method}: {n}")
        # bytes: what the planner's messages say, with the busiest rank's touched rows (the
        # rows all-gathered by hand are padded to them; gloo's own gathers each rank's own)
        own = float(len(torch.unique(x.long())))
        touched = torch.tensor([own])
        dist.all_reduce(touched, op=dist.ReduceOp.MAX)
        expected = 0
        for n, p in model.named_parameters():
            kind = kinds.get(n, "dense")
            k = {"embedding": own if native else float(touched), "linear": float(rows)}
            info = TensorInfo(n, tuple(p.shape), kind, k.get(kind, 0.0), native=native)
            expected += sum(b for _, b in method_messages(info, methods[n], world))
        assert comm.stats.bytes_sent - sent == expected, (method, native)
        assert sync.compressing


@distributed_test(world_size=[2], preload=["torch._dynamo"])
def test_the_executor_starts_from_rank_0s_weights(rank: int, world: int) -> None:
    torch.manual_seed(rank)  # different weights on every rank, as DDP would be given
    model = nn.Sequential(nn.Linear(4, 2))
    SyncExecutor(model, {}, Comm(CommStats()))
    w = model[0].weight.detach().clone()
    dist.broadcast(w, 0)
    assert torch.equal(w, model[0].weight)
