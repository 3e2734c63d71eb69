"""The user's ``nn.Sequential`` taken apart into pdADMM's layers: what admm trains, and its blocks.

One check for every model pdADMM is given, whoever trains it: :func:`admm_maps` (the
modules' order, for :class:`deepjimu.PdADMM`, ``deepjimu.fit("admm", factory, ...)`` and
the ``admm`` strategy alike) and :func:`admm_layers`, which adds the shapes once one
sample's is known (``layers.layer_ops``: kernels, padding, pooling, widths). The layers are
the blocks of :func:`layer_blocks`: one linear map each, sharing the model's modules, so
the weights pdADMM trains are the model's and the state it saves has the model's own keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from deepjimu.errors import JimuError
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.layers import LayerOp, layer_ops

__all__ = [
    "ADMM_PATTERN",
    "AdmmLayers",
    "admm_layers",
    "admm_maps",
    "layer_blocks",
    "new_block",
    "write_weights",
]

ADMM_PATTERN = "[Conv2d, ReLU[, AvgPool2d], ...] [Flatten,] Linear, ReLU, ..., Linear"
"""The models :func:`admm_maps` accepts, as its messages spell them."""

_MAPS = (nn.Linear, nn.Conv2d)
_MAP = ("Linear", "Conv2d")


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules without children, in the order a chain of ``nn.Sequential`` runs them
    (a module used twice counts twice)."""
    return [
        (name, m)
        for name, m in model.named_modules(remove_duplicate=False)
        if not list(m.children())
    ]


def _check_containers(model: nn.Module, who: str) -> None:
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"{who} needs an nn.Sequential (model: {type(model).__name__})")
    for name, m in model.named_modules():
        if list(m.children()) and not isinstance(m, nn.Sequential):
            raise ValueError(
                f"{who} needs {ADMM_PATTERN} in nn.Sequential containers; "
                f"module {name} is a {type(m).__name__}"
            )


def _check_flatten(name: str, m: nn.Flatten, who: str) -> None:
    if m.start_dim != 1 or m.end_dim != -1:
        raise ValueError(f"{who} flattens from dim 1; module {name} is {m}")


def admm_maps(model: nn.Module, who: str = "PdADMM") -> list[nn.Linear | nn.Conv2d]:
    """The linear map of every layer of ``model``, after checking that pdADMM trains it.

    pdADMM's layer equations are ``z_l = A_l(p_l) + b_l`` and ``q_l = relu(z_l)``, so the
    leaf modules (nested ``nn.Sequential`` blocks are read in order) must be conv layers
    (``Conv2d``, ``ReLU``, optionally ``AvgPool2d``, which folds into the next layer), then
    an optional ``Flatten``, then ``Linear`` and ``ReLU`` alternating, ending with a
    ``Linear`` (a ``Flatten`` may also come first). A Tanh, a Sigmoid or a Dropout would be
    trained as if it were a ReLU, or not at all; a container other than ``nn.Sequential``
    may compute anything from its children (a residual sum, say). Kernel sizes, padding,
    strides and widths are checked with the input's shape (:func:`admm_layers`).

    Args:
        model: the user's ``nn.Sequential``.
        who: what the messages say needs the pattern (``PdADMM``, or ``admm`` for fit).

    Returns:
        the ``nn.Linear`` or ``nn.Conv2d`` of every layer, in order.

    Raises:
        ValueError: naming the first module that breaks the pattern, e.g.
            ``PdADMM needs ... Linear, ReLU, ..., Linear; module 1.1 is Tanh() (expected ReLU)``.

    Example:
        >>> len(admm_maps(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))))
        2
    """
    _check_containers(model, who)
    leaves = _leaves(model)
    if leaves and isinstance(leaves[0][1], nn.Flatten):
        _check_flatten(leaves[0][0], leaves[0][1], who)
        leaves = leaves[1:]
    if not leaves:
        raise ValueError(f"{who} needs {ADMM_PATTERN}; the model has no layers")
    maps: list[nn.Linear | nn.Conv2d] = []
    expect: tuple[str, ...] = _MAP
    for name, m in leaves:
        if isinstance(m, nn.MaxPool2d):
            raise ValueError(
                f"{who} cannot train max pooling (module {name}: {m}): it is not linear; "
                "use average pooling (nn.AvgPool2d, as cnn:C1-C2-... models do)"
            )
        if type(m).__name__ not in expect:
            wanted = " or ".join(expect) if expect != _MAP else "Linear or Conv2d"
            raise ValueError(
                f"{who} needs {ADMM_PATTERN}; module {name} is {m} (expected {wanted})"
            )
        if isinstance(m, nn.Flatten):
            _check_flatten(name, m, who)
            expect = ("Linear",)
        elif isinstance(m, nn.ReLU) and isinstance(maps[-1], nn.Conv2d):
            expect = ("AvgPool2d", *_MAP, "Flatten")
        elif isinstance(m, nn.AvgPool2d):
            expect = (*_MAP, "Flatten")
        elif isinstance(m, nn.ReLU):
            expect = _MAP
        else:
            maps.append(_checked_map(name, m, maps, who))
            expect = ("ReLU",)
    if isinstance(leaves[-1][1], nn.ReLU):
        raise ValueError(f"{who} needs {ADMM_PATTERN}; the last module {leaves[-1][0]} is a ReLU")
    if not isinstance(maps[-1], nn.Linear):
        raise ValueError(
            f"{who} needs a Linear last (the classifier, {ADMM_PATTERN}); "
            f"module {leaves[-1][0]} is {leaves[-1][1]}"
        )
    return maps


def _checked_map(
    name: str, m: nn.Module, maps: list[nn.Linear | nn.Conv2d], who: str
) -> nn.Linear | nn.Conv2d:
    """``m``, a Linear or Conv2d, after checking its bias, that it is not a Conv2d after a
    Linear, and that no earlier layer uses it."""
    assert isinstance(m, _MAPS)
    what = type(m).__name__
    if isinstance(m, nn.Conv2d) and any(isinstance(x, nn.Linear) for x in maps):
        raise ValueError(f"{who} needs {ADMM_PATTERN}; module {name} is {m} after a Linear")
    if m.bias is None:
        raise ValueError(f"{who} needs a bias in every {what}; module {name} is {m}")
    if any(m is seen for seen in maps):  # one W written back twice per iteration
        raise ValueError(f"{who} needs a {what} of its own per layer; module {name} repeats one")
    return m


class AdmmLayers(NamedTuple):
    """``model`` as pdADMM trains it: its blocks (:func:`layer_blocks`), each block's linear
    map, and each layer's operator (``layers.layer_ops``)."""

    blocks: nn.Sequential
    maps: list[nn.Linear | nn.Conv2d]
    ops: list[LayerOp]


def admm_layers(
    model: nn.Module, feature_shape: tuple[int, ...], *, cg_max_iter: int = 50, who: str = "admm"
) -> AdmmLayers:
    """:func:`admm_maps`' check, then the operators on inputs of one sample's ``feature_shape``.

    Raises:
        JimuError: the model breaks the pattern (:func:`admm_maps`'s line) or a layer's
            shape (an even kernel, a stride, widths that do not chain; ``layer_ops``'s line).
    """
    try:
        maps = admm_maps(model, who)
    except ValueError as e:
        raise JimuError(str(e)) from None
    blocks = layer_blocks(model)
    return AdmmLayers(blocks, maps, layer_ops(blocks, feature_shape, cg_max_iter=cg_max_iter))


def layer_blocks(model: nn.Module) -> nn.Sequential:
    """``model``'s leaf modules grouped into blocks of one linear map each, the modules shared.

    A block starts at each ``Linear`` or ``Conv2d``, or at the ``Flatten`` before it, and
    holds what follows up to the next: ``[Flatten,] Linear, ReLU`` or ``Conv2d, ReLU,
    AvgPool2d``, the form ``strategies.admm.layers.layer_ops`` reads. The blocks of an
    ``mlp:``/``cnn:`` model are its own children; a factory's flat ``[Flatten,] Linear,
    ReLU, ..., Linear`` becomes the same form. The blocks hold the model's own modules, so
    training them trains ``model``, whose ``state_dict`` keys stay its own.

    Example:
        >>> layer_blocks(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))[0]
        Sequential(
          (0): Linear(in_features=4, out_features=8, bias=True)
          (1): ReLU()
        )
    """
    blocks: list[list[nn.Module]] = [[]]
    for _, m in _leaves(model):
        if isinstance(m, (nn.Flatten, *_MAPS)) and any(isinstance(b, _MAPS) for b in blocks[-1]):
            blocks.append([])
        blocks[-1].append(m)
    return nn.Sequential(*(nn.Sequential(*b) for b in blocks if b))


def _bias(m: nn.Linear | nn.Conv2d) -> Tensor:
    """``m.bias``, which :func:`admm_maps` checked is there."""
    assert m.bias is not None
    return m.bias


def new_block(
    maps: Sequence[nn.Linear | nn.Conv2d],
    ops: Sequence[LayerOp],
    lo: int,
    hi: int,
    params: AdmmParams,
) -> LayerBlock:
    """Layers ``lo .. hi-1`` of the model as a :class:`LayerBlock`, starting from copies of
    its maps' current weights (the strategy's, :class:`deepjimu.PdADMM`'s and the plan's)."""
    W = [maps[l].weight.detach().clone() for l in range(lo, hi)]
    b = [_bias(maps[l]).detach().clone() for l in range(lo, hi)]
    return LayerBlock(lo, hi, len(maps), W, b, params, ops[lo:hi])


def write_weights(
    maps: Sequence[nn.Linear | nn.Conv2d], weights: Mapping[int, tuple[Tensor, Tensor]]
) -> None:
    """Each layer's (W, b) of ``weights`` (a block's readout) into the model's own maps."""
    with torch.no_grad():
        for l, (W, b) in weights.items():
            maps[l].weight.copy_(W)
            _bias(maps[l]).copy_(b)
