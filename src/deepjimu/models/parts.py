"""Building a model in parts: each block built in turn, a block another worker owns freed at once."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["Keep", "placed", "skeleton"]

Keep = Callable[[int], bool] | None
"""Which blocks (by index) a worker keeps; None: all."""


def placed(index: int, block: nn.Module, keep: Keep) -> nn.Module:
    """``block`` as this worker holds it: itself where it is kept, else on the meta device
    (its weights were drawn, so the next block's are drawn from the same random stream as
    in the whole model, then freed: a worker never holds more than its blocks and one
    other).

    Example:
        >>> placed(1, nn.Linear(2, 2), lambda i: i == 0).weight.is_meta
        True
    """
    return block if keep is None or keep(index) else block.to("meta")


def skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device (no memory)."""
    memo: dict[int, Any] = {
        id(t): (nn.Parameter(t.to("meta"), t.requires_grad) if isinstance(t, nn.Parameter)
                else t.to("meta"))
        for t in [*model.parameters(), *model.buffers()]
    }  # fmt: skip
    return copy.deepcopy(model, memo)
