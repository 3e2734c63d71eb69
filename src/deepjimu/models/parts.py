"""Building a model in parts: each block built in turn and handed to the worker's ``Place``, which keeps it, shards it or frees it at once."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from typing import Any

from torch import nn

__all__ = ["Place", "keeping", "placed", "skeleton"]

Place = Callable[[int, nn.Module], nn.Module] | None
"""What a worker does with block ``index`` of its model as soon as it is built: returns
the block as the worker holds it (the block itself, or on the meta device once the worker
has taken what it needs of it); None: every block kept whole."""


def placed(index: int, block: nn.Module, place: Place) -> nn.Module:
    """``block`` as this worker holds it (``place``'s). Its weights were drawn before
    ``place`` sees it, so the next block's are drawn from the same random stream as in the
    whole model: a worker never holds more than what it keeps and one block besides.

    Example:
        >>> placed(1, nn.Linear(2, 2), keeping({0})).weight.is_meta
        True
    """
    return block if place is None else place(index, block)


def keeping(own: Collection[int]) -> Place:
    """The ``Place`` of a worker that holds the blocks ``own`` (by index) and frees the others.

    Example:
        >>> keeping({0})(0, nn.Linear(2, 2)).weight.is_meta
        False
    """
    return lambda index, block: block if index in own else block.to("meta")


def skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device (no memory)."""
    memo: dict[int, Any] = {
        id(t): (nn.Parameter(t.to("meta"), t.requires_grad) if isinstance(t, nn.Parameter)
                else t.to("meta"))
        for t in [*model.parameters(), *model.buffers()]
    }  # fmt: skip
    return copy.deepcopy(model, memo)
