"""Convolutional models: a plain CNN, a LeNet-style CNN and a small ResNet, as block sequences."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from deepjimu.models.parts import Place, placed

__all__ = ["BasicBlock", "cnn", "lenet", "pool_plan", "resnet"]


def _flat_size(blocks: list[nn.Module], feature_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        x = torch.zeros(1, *feature_shape)
        for b in blocks:
            x = b(x)
    return int(x.numel())


def pool_plan(depth: int, size: tuple[int, int]) -> list[bool]:
    """Which of ``depth`` conv blocks end in a 2x2 average pooling, for maps of ``size`` (H, W).

    Every block pools while the map allows it; a map of side S allows floor(log2 S) halvings
    (down to 1x1, floor mode). A deeper CNN gets that many pools spread evenly over its
    blocks, the last block always pooling (VGG-like stages), instead of a tail of convs on
    1x1 maps. Example: depth 8 on 8x8 digits pools after blocks 3, 6 and 8.
    """
    m = min(depth, int(math.log2(min(size))))
    return [(i + 1) * m // depth > i * m // depth for i in range(depth)]


def cnn(
    feature_shape: tuple[int, ...], channels: tuple[int, ...], num_classes: int, place: Place = None
) -> nn.Sequential:
    """Blocks ``Conv2d(3x3, same), ReLU[, AvgPool2d(2)]`` per channel count, then a linear
    classifier; each block handed to ``place`` as it is built
    (:func:`~deepjimu.models.parts.placed`).

    The pooling follows :func:`pool_plan`; the last block is ``Flatten, Linear``. Average
    pooling (not max) keeps every map a linear function of the previous ReLU output, which
    is what the ``admm`` strategy folds into the next layer.

    Example:
        >>> cnn((1, 8, 8), (16, 32), 10)[1]
        Sequential(
          (0): Conv2d(16, 32, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
          (1): ReLU()
          (2): AvgPool2d(kernel_size=2, stride=2, padding=0)
        )
    """
    c, h, w = feature_shape
    blocks: list[nn.Module] = []
    for c_out, pools in zip(channels, pool_plan(len(channels), (h, w)), strict=True):
        layers: list[nn.Module] = [nn.Conv2d(c, c_out, 3, padding=1), nn.ReLU()]
        if pools:
            layers.append(nn.AvgPool2d(2))
            h, w = h // 2, w // 2
        blocks.append(placed(len(blocks), nn.Sequential(*layers), place))
        c = c_out
    last = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes))
    return nn.Sequential(*blocks, placed(len(blocks), last, place))


def lenet(feature_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """LeNet-5 style: two conv(5x5, same padding)+ReLU+maxpool blocks, then three dense blocks."""
    c = feature_shape[0]
    convs: list[nn.Module] = [
        nn.Sequential(nn.Conv2d(c, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(6, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2)),
    ]
    flat = _flat_size(convs, feature_shape)
    dense = [
        nn.Sequential(nn.Flatten(), nn.Linear(flat, 120), nn.ReLU()),
        nn.Sequential(nn.Linear(120, 84), nn.ReLU()),
        nn.Sequential(nn.Linear(84, num_classes)),
    ]
    return nn.Sequential(*convs, *dense)


class BasicBlock(nn.Module):
    """Residual block: two 3x3 conv+BN, identity or 1x1 projection shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(
    feature_shape: tuple[int, ...], num_classes: int, blocks_per_stage: int = 1
) -> nn.Sequential:
    """ResNet for 32x32 images (He et al. CIFAR design): stem, 3 stages (16, 32, 64), pooled head.

    ``blocks_per_stage=1`` is ResNet-8, 3 is ResNet-20.
    """
    c = feature_shape[0]
    blocks: list[nn.Module] = [
        nn.Sequential(nn.Conv2d(c, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    ]
    c_in = 16
    for i, c_out in enumerate((16, 32, 64)):
        for j in range(blocks_per_stage):
            blocks.append(BasicBlock(c_in, c_out, 2 if i > 0 and j == 0 else 1))
            c_in = c_out
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)))
    return nn.Sequential(*blocks)
