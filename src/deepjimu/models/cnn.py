"""Convolutional models: a LeNet-style CNN and a small ResNet for CIFAR-10, as block sequences."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["BasicBlock", "lenet", "resnet"]


def _flat_size(blocks: list[nn.Module], feature_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        x = torch.zeros(1, *feature_shape)
        for b in blocks:
            x = b(x)
    return int(x.numel())


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
