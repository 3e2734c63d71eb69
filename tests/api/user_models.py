"""Model factories as a user writes them, in a module file the spawned workers can import."""

from __future__ import annotations

from torch import nn


def flat_mlp() -> nn.Sequential:
    """A plain nn.Sequential, not cut into blocks: what admm groups into layers itself."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def tanh_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))


def small_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10)
    )


def pooled_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 10)
    )


def no_flatten() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
