"""The p-step, narrowing and widening layers, against a dense solve of its normal equations in float64."""

from __future__ import annotations

import pytest
import torch

from deepjimu.admm_math.updates import update_p

DT = torch.float64


def _dense_p(W, b, z, q_prev, u_prev, rho: float, nu: float) -> torch.Tensor:
    """argmin_p (nu/2)||z - p W^T - b||^2 + <u, p - q> + (rho/2)||p - q||^2, as one linear system.

    With x = vec(p) (rows of p one after another), vec(p W^T) = (I_N kron W) x, so the
    minimiser solves (nu A^T A + rho I) x = nu A^T vec(z - b) - vec(u) + rho vec(q) for
    A = I_N kron W: the whole N n_in system at once, with none of update_p's shortcuts.
    """
    N, n_in = q_prev.shape
    A = torch.kron(torch.eye(N, dtype=DT), W)
    lhs = nu * A.T @ A + rho * torch.eye(N * n_in, dtype=DT)
    rhs = nu * A.T @ (z - b).reshape(-1) - u_prev.reshape(-1) + rho * q_prev.reshape(-1)
    return torch.linalg.solve(lhs, rhs).reshape(N, n_in)


@pytest.mark.parametrize(
    ("n_in", "n_out", "rho", "nu"),
    [(3, 8, 0.7, 1.3), (2, 9, 1e-3, 5.0), (5, 6, 4.0, 0.2), (6, 6, 1.0, 1.0), (8, 3, 0.7, 1.3)],
)
def test_update_p_equals_the_dense_solve(n_in: int, n_out: int, rho: float, nu: float) -> None:
    # n_out > n_in widens: update_p factorises the n_in x n_in Hessian (the branch that
    # narrowing layers, the output layer among them, never take)
    g = torch.Generator().manual_seed(n_in * 10 + n_out)
    N = 11
    W, b = (
        torch.randn(n_out, n_in, generator=g, dtype=DT),
        torch.randn(n_out, generator=g, dtype=DT),
    )
    z = torch.randn(N, n_out, generator=g, dtype=DT)
    q_prev, u_prev = (torch.randn(N, n_in, generator=g, dtype=DT) for _ in range(2))
    p = update_p(W, b, z, q_prev, u_prev, rho, nu)
    expected = _dense_p(W, b, z, q_prev, u_prev, rho, nu)
    assert p.dtype == DT and p.shape == (N, n_in)
    torch.testing.assert_close(p, expected, rtol=1e-10, atol=1e-10)


def test_a_widening_p_step_keeps_float32() -> None:
    g = torch.Generator().manual_seed(3)
    W, b, z = (
        torch.randn(9, 4, generator=g),
        torch.randn(9, generator=g),
        torch.randn(5, 9, generator=g),
    )
    q_prev, u_prev = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    p = update_p(W, b, z, q_prev, u_prev, 0.5, 2.0)
    expected = _dense_p(*(t.double() for t in (W, b, z, q_prev, u_prev)), 0.5, 2.0)
    assert p.dtype == torch.float32
    torch.testing.assert_close(p.double(), expected, rtol=1e-4, atol=1e-5)
