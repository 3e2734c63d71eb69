"""The user's ``nn.Sequential`` taken apart into pdADMM's layers: what admm trains, and its blocks.

One rule for the user's own model, whoever trains it: :class:`deepjimu.PdADMM` and
``deepjimu.fit("admm", factory, ...)`` both accept it by :func:`admm_linears`, and the
``admm`` strategy trains any model, its own ``mlp:``/``cnn:`` or a factory's flat one, as
the blocks of :func:`layer_blocks`: one linear map each, sharing the model's modules, so the
weights it trains are the model's and the state it saves has the model's own keys.
"""

from __future__ import annotations

from torch import nn

__all__ = ["MLP_PATTERN", "admm_linears", "layer_blocks"]

MLP_PATTERN = "[Flatten,] Linear, ReLU, ..., Linear"
"""The models :func:`admm_linears` accepts, as its messages spell them."""

_MAPS = (nn.Linear, nn.Conv2d)


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules without children, in the order a chain of ``nn.Sequential`` runs them
    (a module used twice counts twice)."""
    return [
        (name, m)
        for name, m in model.named_modules(remove_duplicate=False)
        if not list(m.children())
    ]


def admm_linears(model: nn.Module, who: str = "PdADMM") -> list[nn.Linear]:
    """The Linear layers of ``model`` after checking that it is the MLP pdADMM assumes.

    pdADMM's layer equations are ``z_l = W_l p_l + b_l`` and ``q_l = relu(z_l)``, so the
    leaf modules (nested ``nn.Sequential`` blocks are read in order) must be an optional
    ``Flatten`` first, then ``Linear`` (with bias) and ``ReLU`` alternating, ending with a
    ``Linear``: a Tanh, a Sigmoid or a Dropout would be trained as if it were a ReLU, or
    not at all; a container other than ``nn.Sequential`` may compute anything from its
    children (a residual sum, say).

    Args:
        model: the user's ``nn.Sequential``.
        who: what the messages say needs the pattern (``PdADMM``, or ``admm`` for fit).

    Returns:
        the ``nn.Linear`` of every layer, in order.

    Raises:
        ValueError: naming the first module that breaks the pattern, e.g.
            ``PdADMM needs [Flatten,] Linear, ReLU, ..., Linear; module 1.1 is Tanh()``;
            a Conv2d is pointed to the strategy that trains CNNs.

    Example:
        >>> len(admm_linears(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))))
        2
    """
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"{who} needs an nn.Sequential (model: {type(model).__name__})")
    for name, m in model.named_modules():
        if list(m.children()) and not isinstance(m, nn.Sequential):
            raise ValueError(
                f"{who} needs {MLP_PATTERN} in nn.Sequential containers; "
                f"module {name} is a {type(m).__name__}"
            )
    leaves = _leaves(model)
    if leaves and isinstance(leaves[0][1], nn.Flatten):
        if leaves[0][1].start_dim != 1 or leaves[0][1].end_dim != -1:
            raise ValueError(f"{who} flattens from dim 1; module {leaves[0][0]} is {leaves[0][1]}")
        leaves = leaves[1:]
    if not leaves:
        raise ValueError(f"{who} needs {MLP_PATTERN}; the model has no layers")
    linears: list[nn.Linear] = []
    for i, (name, m) in enumerate(leaves):
        if isinstance(m, nn.Conv2d):
            raise ValueError(
                f"{who} trains MLPs ({MLP_PATTERN}); module {name} is {m}: CNNs train with "
                f"jimu train --strategy admm --model cnn:C1-C2-... (e.g. cnn:16-32)"
            )
        want: type[nn.Module] = nn.Linear if i % 2 == 0 else nn.ReLU
        if type(m) is not want:
            raise ValueError(
                f"{who} needs {MLP_PATTERN}; module {name} is {m} (expected {want.__name__})"
            )
        if isinstance(m, nn.Linear):
            if m.bias is None:
                raise ValueError(f"{who} needs a bias in every Linear; module {name} is {m}")
            if any(m is seen for seen in linears):  # one W written back twice per iteration
                raise ValueError(
                    f"{who} needs a Linear of its own per layer; module {name} repeats one"
                )
            linears.append(m)
    if isinstance(leaves[-1][1], nn.ReLU):
        raise ValueError(f"{who} needs {MLP_PATTERN}; the last module {leaves[-1][0]} is a ReLU")
    return linears


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
