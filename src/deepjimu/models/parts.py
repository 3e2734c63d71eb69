"""Building a model in parts: each block built in turn and handed to the worker's ``Place``, which keeps it, shards it or frees it at once."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SHAPED_IN_MEMORY", "Place", "keeping", "placed", "shaped", "skeleton", "zeroed"]

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


def zeroed(block: nn.Module, device: torch.device | str) -> nn.Module:
    """A copy of ``block`` on ``device`` whose weights and buffers are zeros of their shapes
    (``block`` may be on the meta device: another worker's, never built here).

    Not ``Module.to_empty``: on meta tensors it runs torch's Python references, whose first
    use imports sympy and much of torch's compiler (about a second of CPU)."""
    return copy.deepcopy(block)._apply(lambda t: torch.zeros(t.shape, dtype=t.dtype, device=device))


SHAPED_IN_MEMORY = 64 * 2**20
"""Bytes of weights and buffers up to which :func:`shaped` runs a block as zeros in memory
rather than on the meta device."""


@torch.no_grad()
def shaped(block: nn.Module, x: Tensor) -> Tensor:
    """``block``'s output for an input of ``x``'s shape and dtype, on the meta device: its
    shape and dtype alone (``block`` is not changed; run in eval mode).

    A block of at most :data:`SHAPED_IN_MEMORY` bytes runs as zeros on the CPU (``x``'s
    values where it has any, zeros of its shape where it is on the meta device), a larger
    one on the meta device. The reason: torch's meta kernels of a matrix product are Python
    references whose first use imports sympy and much of torch's compiler, about 1.2 s of
    CPU in every process that plans on a model's shapes (every run's launcher, and the
    workers of the split strategies), for blocks a copy of which costs nothing.

    Example:
        >>> shaped(nn.Linear(3, 4).to("meta"), torch.zeros(2, 3, device="meta")).shape
        torch.Size([2, 4])
    """
    size = sum(t.numel() * t.element_size() for t in [*block.parameters(), *block.buffers()])
    if size > SHAPED_IN_MEMORY:
        return skeleton(block).eval()(x.to("meta"))
    inp = torch.zeros(x.shape, dtype=x.dtype) if x.is_meta else x.cpu()
    return zeroed(block, "cpu").eval()(inp).to("meta")


def skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device (no memory)."""
    memo: dict[int, Any] = {
        id(t): (nn.Parameter(t.to("meta"), t.requires_grad) if isinstance(t, nn.Parameter)
                else t.to("meta"))
        for t in [*model.parameters(), *model.buffers()]
    }  # fmt: skip
    return copy.deepcopy(model, memo)
