"""Multi-layer perceptron as a sequence of (Linear, ReLU) blocks."""

from __future__ import annotations

import math

from torch import nn

from deepjimu.models.parts import Place, placed

__all__ = ["mlp"]


def mlp(
    feature_shape: tuple[int, ...], widths: tuple[int, ...], num_classes: int, place: Place = None
) -> nn.Sequential:
    """Blocks ``[Flatten,] Linear, ReLU`` per hidden width, then ``Linear`` to the classes;
    each block handed to ``place`` as it is built (:func:`~deepjimu.models.parts.placed`).

    Example:
        >>> mlp((1, 8, 8), (256, 256, 256), 10)[0]
        Sequential(
          (0): Flatten(start_dim=1, end_dim=-1)
          (1): Linear(in_features=64, out_features=256, bias=True)
          (2): ReLU()
        )
    """
    d = math.prod(feature_shape)
    blocks: list[nn.Module] = []
    for i, w in enumerate(widths):
        head = [nn.Flatten()] if i == 0 and len(feature_shape) > 1 else []
        blocks.append(placed(i, nn.Sequential(*head, nn.Linear(d, w), nn.ReLU()), place))
        d = w
    head = [nn.Flatten()] if not widths and len(feature_shape) > 1 else []
    blocks.append(placed(len(widths), nn.Sequential(*head, nn.Linear(d, num_classes)), place))
    return nn.Sequential(*blocks)
