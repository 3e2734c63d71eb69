"""Building a model in parts: each block built in turn, a block another worker owns freed at once."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["Keep", "placed"]

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
