"""``ddp``: data parallel with torch DistributedDataParallel; bytes counted in its comm hook."""

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from deepjimu.comm import Comm, nbytes
from deepjimu.config import PRECISIONS, RunConfig
from deepjimu.data import DataSplits
from deepjimu.run import Run
from deepjimu.strategies.base import GradientStrategy, accuracies, count_correct, make_optimizer

__all__ = ["DDPStrategy"]


class _HookState:
    """State of :func:`_counting_hook`: the byte counter and when the last bucket was handed over."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self.last_call = 0.0


# (no `from __future__ import annotations` here: DDP checks the hook's annotations at runtime)
def _counting_hook(
    state: _HookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: count each bucket's payload, then all-reduce it with torch's own hook.

    The time ``backward()`` still blocks after the last bucket was handed over is
    communication not hidden behind gradient computation: that is the step's wait.
    """
    buf = bucket.buffer()
    state.comm.count(sent=nbytes(buf), recv=nbytes(buf))
    state.last_call = time.perf_counter()
    return default_hooks.allreduce_hook(None, bucket)


class DDPStrategy(GradientStrategy):
    """Each rank trains a replica on its shard (rows ``rank::world``); gradients are averaged.

    ``--batch-size`` is the global batch: every step, each rank takes about
    ``batch_size / world`` of its shard, so the hyper-parameters mean what they mean for
    ``local``.
    """

    name = "ddp"
    default_workers = 2
    shards_data = True
    needs_group = True
    precisions = PRECISIONS
    supports_kfac = True

    @classmethod
    def problems(cls, cfg: RunConfig, n_blocks: int) -> list[str]:
        w = cfg.workers or cls.default_workers
        if cfg.batch_size < w:
            return [
                f"batch-size must be >= workers for ddp (batch-size: {cfg.batch_size}, workers: {w})"
            ]
        return []

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        self.model = model.to(run.device)
        ids = [run.device.index] if run.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(self.model, device_ids=ids)
        self.hook = _HookState(run.comm)
        self.ddp.register_comm_hook(self.hook, _counting_hook)
        self.run = run
        self.optimizer = make_optimizer(self.ddp.parameters(), self.cfg, self.model, run.comm)

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.run.autocast():
            loss = F.cross_entropy(self.ddp(x), y)
        loss.backward()
        self.run.synchronize()
        self.run.stats.wait_s += max(0.0, time.perf_counter() - self.hook.last_call)
        self.optimizer.step()
        return loss

    def evaluate(self, data: DataSplits, run: Run) -> dict[str, float | None]:
        # the training split is sharded: sum correct / count over ranks (bookkeeping, not counted)
        correct, _, n = count_correct(self.model, data.train_x, data.train_y)
        totals = torch.tensor([correct, n], dtype=torch.float64, device=run.device)  # NCCL: on GPU
        dist.all_reduce(totals)
        if not run.is_main:
            return {}
        return {
            "train_acc": float(totals[0] / totals[1]),
            **accuracies(self.model, data, ("val", "test")),
        }
