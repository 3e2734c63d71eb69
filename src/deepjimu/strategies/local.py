"""``local``: one process, backprop, torch.optim (the reference every other strategy is held to)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from deepjimu.config import PRECISIONS
from deepjimu.strategies.base import GradientStrategy

__all__ = ["LocalStrategy"]


class LocalStrategy(GradientStrategy):
    """Plain mini-batch training on one device."""

    name = "local"
    max_workers = 1
    precisions = PRECISIONS
    supports_kfac = True

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.run.autocast():
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss
