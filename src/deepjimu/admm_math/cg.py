"""Conjugate gradients on a batch of independent systems H x_i = r_i that share one SPD operator H."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["CGSolve", "batched_cg"]


class CGSolve(NamedTuple):
    """Result of :func:`batched_cg`: the solution, iterations run, and whether every sample met tol."""

    x: Tensor
    iterations: int
    converged: bool


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-sample inner products <a_i, b_i>, shaped to broadcast against a sample: [N, 1, ...]."""
    return (a * b).flatten(1).sum(dim=1).view(-1, *([1] * (a.dim() - 1)))


def batched_cg(
    matvec: Callable[[Tensor], Tensor],
    rhs: Tensor,
    x0: Tensor,
    *,
    tol: float,
    max_iter: int,
) -> CGSolve:
    """Solve H x_i = rhs_i for every sample i (dim 0) by conjugate gradients.

    torch has no conjugate gradients (scipy's runs one system on the CPU), hence this loop.
    H acts on each sample alone (as a convolution does), so the N systems are independent: each
    gets its own step sizes alpha_i, beta_i, which is exact CG on every system at once for the
    price of one ``matvec`` on the batch per iteration. A sample stops moving once its residual
    ||rhs_i - H x_i|| is at most ``tol`` ||rhs_i||, so its result does not depend on which
    other samples share its batch. The loop ends when every sample has stopped or after
    ``max_iter`` iterations.

    Args:
        matvec: x -> H x for a batch, H symmetric positive definite per sample.
        rhs: right-hand sides, [N, ...].
        x0: starting point (a warm start), same shape as ``rhs``.
        tol: relative residual per sample, >= 0.
        max_iter: iteration cap, >= 0.

    Returns:
        ``CGSolve(x, iterations, converged)``; ``converged`` is False when the cap stopped it.

    Raises:
        ValueError: mismatched shapes, tol < 0 or max_iter < 0.

    Example:
        >>> sol = batched_cg(lambda v: 2 * v, torch.ones(3, 4), torch.zeros(3, 4), tol=1e-6, max_iter=5)
        >>> sol.x[0, 0].item(), sol.iterations
        (0.5, 1)
    """
    if rhs.shape != x0.shape:
        raise ValueError(f"x0 must have the shape of rhs {list(rhs.shape)} (got {list(x0.shape)})")
    if not (tol >= 0 and max_iter >= 0):
        raise ValueError(f"tol and max_iter must be >= 0 (tol: {tol}, max_iter: {max_iter})")
    x = x0.clone()
    r = rhs - matvec(x)
    rr = _dot(r, r)
    # a zero right-hand side stops on an exactly zero residual, not on 0 <= tol * 0 from the start
    limit = (tol * tol) * _dot(rhs, rhs).clamp(min=torch.finfo(rhs.dtype).tiny)
    active = rr > limit
    d = r.clone()
    for it in range(max_iter):
        if not bool(active.any()):
            return CGSolve(x, it, True)
        Hd = matvec(d)
        dHd = _dot(d, Hd)
        alpha = torch.where(active, rr / dHd.clamp(min=torch.finfo(rhs.dtype).tiny), 0)
        x.add_(alpha * d)
        r.sub_(alpha * Hd)
        rr_new = _dot(r, r)
        beta = torch.where(active, rr_new / rr.clamp(min=torch.finfo(rhs.dtype).tiny), 0)
        d.mul_(beta).add_(r)
        rr = rr_new
        active &= rr > limit
    return CGSolve(x, max_iter, not bool(active.any()))
