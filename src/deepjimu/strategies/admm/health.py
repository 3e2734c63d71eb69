"""Is a pdADMM run learning? Pure checks on its logged figures, and the line for a failed solve."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["STALL", "Learning", "chance_accuracy", "hint", "readout_failed", "solve_failed"]

# relative fall of the training loss over half the patience below which a run is stuck.
# Measured on digits (mlp:32x2, rho and nu from 1e-4 to 1e4, and extremes): runs stuck at
# chance fell by 0.07% or less over 5 iterations, runs that learned slowly by 0.43% or more.
STALL = 0.002


def hint(rho: float, nu: float) -> str:
    """What to try for a run with these ``rho`` and ``nu`` that is not learning.

    From the grid of :data:`STALL`: nu >= 100, or rho <= nu / 100, stayed at or near chance.
    A run that has rho and nu in the range that learned is not told to set them again.

    Example:
        >>> hint(1e-4, 1.0)
        'on digits pdADMM learned with 0.01 <= nu <= 1 and rho >= nu; try --rho 1 --nu 1'
    """
    learned = "0.01 <= nu <= 1 and rho >= nu"
    if 0.01 <= nu <= 1 and rho >= nu:
        return (
            f"rho and nu already lie where pdADMM learned on digits ({learned}): the "
            "model, not the penalties, is what to change (its depth and width, --admm-init)"
        )
    return f"on digits pdADMM learned with {learned}; try --rho 1 --nu 1"


def chance_accuracy(y: Tensor) -> float:
    """The accuracy of always predicting the most frequent label of ``y``."""
    return float(torch.bincount(y).max()) / len(y) if len(y) else 0.0


@dataclass
class Learning:
    """Watches a run's logged training loss and accuracy; says when it is not learning.

    Not learning: from iteration ``patience`` on, the training accuracy is near chance (less
    than 10% of the way from ``chance`` to 1) *and* the training loss fell by less than
    :data:`STALL` (relative) over the last ``patience // 2`` iterations. A run that learns
    slowly, with its loss still falling, is left alone.

    Args:
        chance: the accuracy of predicting the most frequent class (:func:`chance_accuracy`).
        patience: iterations before judging (the labels' pull needs one per layer to reach
            the first layer, so at least twice the depth).

    Example:
        >>> watch = Learning(chance=0.1, patience=10)
        >>> [watch.check(i, 2.3026, 0.1) for i in (5, 10)][-1][:12]
        'not learning'
    """

    chance: float
    patience: int = 10
    losses: dict[int, float] = field(default_factory=dict)

    def check(
        self, iteration: int, loss: float | None, train_acc: float | None, whose: str = ""
    ) -> str | None:
        """Record one logged iteration; a one-line finding if the run is not learning, else None.

        ``whose`` names the network the figures are of in that line (e.g. "the iterate's ").
        """
        if loss is None or train_acc is None or not math.isfinite(loss):
            return None
        self.losses[iteration] = loss
        if iteration < self.patience or train_acc >= self.chance + 0.1 * (1 - self.chance):
            return None
        earlier = [i for i in self.losses if i <= iteration - self.patience // 2]
        if not earlier:
            return None
        then = max(earlier)
        before = self.losses[then]
        if before - loss >= STALL * abs(before):
            return None
        return (
            f"not learning: {whose}train accuracy {train_acc:.3f} at iteration {iteration} is near "
            f"chance ({self.chance:.3f}) and the loss barely moved since iteration {then} "
            f"({before:.4f} -> {loss:.4f})"
        )


def solve_failed(error: Exception, iteration: int, rho: float, nu: float) -> str:
    """The one line for a factorisation that failed in iteration ``iteration``.

    The p and W subproblems factorise matrices such as nu W W^T + rho I; when nu / rho is
    so large that rho I vanishes beside nu W W^T in float32, a singular W W^T makes the
    factorisation fail. Measured on digits: every nu / rho up to 1e8 factorised, 1e12 and
    1e24 failed within 3 iterations.
    """
    return (
        f"admm: a factorisation failed in iteration {iteration} (rho: {rho:g}, nu: {nu:g}, "
        f"nu/rho: {nu / rho:.0e}): {_detail(error)}; lower nu/rho (up to 1e8 factorised on "
        "digits), e.g. --rho 1 --nu 1"
    )


def readout_failed(error: Exception, remedy: str) -> str:
    """The one line for a readout whose least squares failed; ``remedy`` names the way out."""
    return f"admm: a least squares of the readout failed: {_detail(error)}; use {remedy}"


def _detail(error: Exception) -> str:
    """A linear-algebra error's message on one line, at most 160 characters."""
    return " ".join(str(error).split())[:160]
