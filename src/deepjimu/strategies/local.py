"""``local``: one process, backprop, torch.optim (the reference every other strategy is held to)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.data import DataSplits, epoch_seed
from deepjimu.options import LocalOptions
from deepjimu.run import Run
from deepjimu.strategies.base import GradientStrategy

__all__ = ["LocalStrategy"]


class LocalStrategy(GradientStrategy):
    """Plain mini-batch training on one device.

    A graph model (``gcn``, with ``data.graph`` set) trains full batch instead: one step
    per epoch, a forward over the whole graph and the loss on the training nodes only
    (Kipf & Welling's masked loss); its "rows" are node indices.
    """

    name = "local"
    cfg: LocalOptions

    def setup(self, model: nn.Sequential, data: DataSplits, run: Run) -> None:
        super().setup(model, data, run)
        self.graph = data.graph

    def batches(self, data: DataSplits, epoch: int, run: Run) -> list[tuple[Tensor, Tensor]]:
        if data.graph is None:
            return super().batches(data, epoch, run)
        # dropout draws from torch's global generator: seeded by (seed, epoch), a run
        # repeats exactly, resumed or not
        torch.manual_seed(epoch_seed(self.cfg.seed, epoch))
        nodes = data.graph.train_idx
        return [(nodes, data.graph.y[nodes])]

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.run.autocast():
            if self.graph is None:
                out = self.model(x)
            else:  # x: the training nodes
                out = self.model(self.graph.x, self.graph.adj)[x]
            loss = F.cross_entropy(out, y)
        loss.backward()
        self.optimizer.step()
        return loss
