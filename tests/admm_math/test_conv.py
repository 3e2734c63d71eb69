"""Conv-layer pdADMM steps against independent computations: explicit matrices, dense solves, L-BFGS."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from test_updates import _argmin, _grad

from deepjimu.admm_math.conv import (
    PSolver,
    avg_pool,
    avg_pool_adjoint,
    choose_p_solver,
    conv_adjoint,
    conv_forward,
    conv_matrix,
    patch_rows,
    update_p_conv,
    update_p_flat,
    update_Wb_conv,
)
from deepjimu.admm_math.updates import centred_gram

DT = torch.float64
N = 3


def _randn(*shape: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, dtype=DT, generator=g)


def _loop_conv_matrix(W: torch.Tensor, H: int, Wd: int) -> torch.Tensor:
    """The 'same' conv as a matrix, entry by entry from its definition (no torch conv)."""
    C_out, C_in, s, _ = W.shape
    r = s // 2
    A = torch.zeros(C_out * H * Wd, C_in * H * Wd, dtype=W.dtype)
    for o, i, j, c, di, dj in itertools.product(
        range(C_out), range(H), range(Wd), range(C_in), range(s), range(s)
    ):
        ii, jj = i + di - r, j + dj - r
        if 0 <= ii < H and 0 <= jj < Wd:
            A[(o * H + i) * Wd + j, (c * H + ii) * Wd + jj] += W[o, c, di, dj]
    return A


def _loop_pool_matrix(C: int, H: int, Wd: int, k: int) -> torch.Tensor:
    """k x k average pooling (floor mode) as a matrix [C (H//k) (W//k), C H W]."""
    Hp, Wp = H // k, Wd // k
    P = torch.zeros(C * Hp * Wp, C * H * Wd, dtype=DT)
    for c, i, j, a, b in itertools.product(range(C), range(Hp), range(Wp), range(k), range(k)):
        P[(c * Hp + i) * Wp + j, (c * H + i * k + a) * Wd + j * k + b] = 1 / (k * k)
    return P


def test_conv_matrix_and_adjoint_match_the_definition() -> None:
    g = torch.Generator().manual_seed(0)
    W = _randn(3, 2, 3, 3, g=g)
    A = _loop_conv_matrix(W, 4, 5)
    torch.testing.assert_close(conv_matrix(W, (2, 4, 5)), A)
    x, y = _randn(N, 2, 4, 5, g=g), _randn(N, 3, 4, 5, g=g)
    torch.testing.assert_close(conv_forward(x, W).flatten(1), x.flatten(1) @ A.T)
    torch.testing.assert_close(conv_adjoint(y, W).flatten(1), y.flatten(1) @ A)
    rows = patch_rows(x, 3)  # im2col: the conv is one matrix product per pixel
    torch.testing.assert_close(
        (rows @ W.reshape(3, -1).T).view(N, 4, 5, 3).permute(0, 3, 1, 2), conv_forward(x, W)
    )


@pytest.mark.parametrize(("H", "Wd", "k"), [(4, 6, 2), (5, 7, 2), (7, 7, 3)])
def test_pooling_and_its_adjoint_match_the_explicit_matrix(H: int, Wd: int, k: int) -> None:
    g = torch.Generator().manual_seed(1)
    P = _loop_pool_matrix(2, H, Wd, k)
    p = _randn(N, 2, H, Wd, g=g)
    x = avg_pool(p, k)
    torch.testing.assert_close(x.flatten(1), p.flatten(1) @ P.T)
    torch.testing.assert_close(avg_pool_adjoint(x, k, (H, Wd)).flatten(1), x.flatten(1) @ P)
    # the fold rests on P P^T = I / k^2, odd sizes (dropped rows) included
    torch.testing.assert_close(P @ P.T, torch.eye(P.shape[0], dtype=DT) / k**2)


def _p_problem(seed: int, k: int, H: int = 5, Wd: int = 7):
    g = torch.Generator().manual_seed(seed)
    C_in, C_out = 2, 3
    W, b = _randn(C_out, C_in, 3, 3, g=g), _randn(C_out, g=g)
    z = _randn(N, C_out, H // k, Wd // k, g=g)
    q_prev, u_prev = _randn(N, C_in, H, Wd, g=g), _randn(N, C_in, H, Wd, g=g)
    return W, b, z, q_prev, u_prev


def _dense_p(M: torch.Tensor, b_flat: torch.Tensor, z, q_prev, u_prev, rho: float, nu: float):
    """The p-step's normal equations in the un-pooled space, solved densely."""
    n = M.shape[1]
    H = nu * M.T @ M + rho * torch.eye(n, dtype=DT)
    rhs = nu * (z.flatten(1) - b_flat) @ M + rho * q_prev.flatten(1) - u_prev.flatten(1)
    return torch.linalg.solve(H, rhs.T).T.view_as(q_prev)


@pytest.mark.parametrize("solver", [PSolver.CG, PSolver.DENSE])
@pytest.mark.parametrize("k", [1, 2])
def test_update_p_conv_equals_the_dense_solve(solver: PSolver, k: int) -> None:
    W, b, z, q_prev, u_prev = _p_problem(2, k)
    rho, nu = 0.7, 1.3
    H, Wd = z.shape[2:]
    M = _loop_conv_matrix(W, H, Wd) @ _loop_pool_matrix(2, 5, 7, k)
    expected = _dense_p(M, b.repeat_interleave(H * Wd), z, q_prev, u_prev, rho, nu)
    sol = update_p_conv(
        W, b, z, q_prev, u_prev, rho, nu, pool=k, solver=solver, tol=1e-12, max_iter=200
    )
    assert sol.converged and (sol.iterations > 0) == (solver is PSolver.CG)
    torch.testing.assert_close(sol.p, expected, rtol=1e-9, atol=1e-9)


def test_update_p_conv_is_the_minimiser_by_lbfgs() -> None:
    W, b, z, q_prev, u_prev = _p_problem(3, 2)
    rho, nu = 0.4, 2.0

    def phi(p: torch.Tensor) -> torch.Tensor:
        r = p - q_prev
        fit = (z - conv_forward(F.avg_pool2d(p, 2), W, b)).square().sum()
        return (nu / 2) * fit + (u_prev * r).sum() + (rho / 2) * r.square().sum()

    sol = update_p_conv(W, b, z, q_prev, u_prev, rho, nu, pool=2, tol=1e-12, max_iter=200)
    (expected,) = _argmin(phi, torch.zeros_like(q_prev))
    torch.testing.assert_close(sol.p, expected, rtol=1e-7, atol=1e-7)
    assert _grad(phi, sol.p)[0].abs().max() < 1e-9


def test_update_p_conv_warm_start_and_cap() -> None:
    W, b, z, q_prev, u_prev = _p_problem(4, 2)
    rho, nu = 1e-3, 1.0  # ill-conditioned: CG needs many iterations

    def phi(p: torch.Tensor) -> torch.Tensor:
        r = p - q_prev
        fit = (z - conv_forward(avg_pool(p, 2), W, b)).square().sum()
        return (nu / 2) * fit + (u_prev * r).sum() + (rho / 2) * r.square().sum()

    exact = update_p_conv(W, b, z, q_prev, u_prev, rho, nu, pool=2, solver=PSolver.DENSE).p
    capped = update_p_conv(W, b, z, q_prev, u_prev, rho, nu, pool=2, tol=1e-10, max_iter=2)
    assert not capped.converged and capped.iterations == 2
    start = q_prev - u_prev / rho  # the default warm start: the link terms' minimiser
    assert phi(exact) < phi(capped.p) < phi(start)
    warm = update_p_conv(W, b, z, q_prev, u_prev, rho, nu, pool=2, p_old=exact, tol=1e-6)
    assert warm.converged and warm.iterations == 0


def test_update_p_flat_equals_the_dense_solve() -> None:
    g = torch.Generator().manual_seed(5)
    W, b = _randn(4, 2 * 2 * 3, g=g), _randn(4, g=g)
    z = _randn(N, 4, g=g)
    q_prev, u_prev = _randn(N, 2, 5, 7, g=g), _randn(N, 2, 5, 7, g=g)
    M = W @ _loop_pool_matrix(2, 5, 7, 2)  # flatten(P p) W^T = p M^T
    expected = _dense_p(M, b, z, q_prev, u_prev, 0.8, 1.5)
    torch.testing.assert_close(update_p_flat(W, b, z, q_prev, u_prev, 0.8, 1.5, pool=2), expected)


@pytest.mark.parametrize(("k", "tau", "ridge"), [(1, 0.0, 0.0), (2, 0.5, 0.0), (2, 0.5, 0.2)])
def test_update_Wb_conv_is_the_joint_minimiser(k: int, tau: float, ridge: float) -> None:
    g = torch.Generator().manual_seed(6)
    p = _randn(N, 2, 8, 7, g=g) + 1.5  # non-centred: W and b are coupled
    W_old, b_old = _randn(3, 2, 3, 3, g=g), _randn(3, g=g)
    z = _randn(N, 3, 8 // k, 7 // k, g=g)  # at least 36 equations for 19 unknowns per channel
    nu = 0.9
    # relative ridge: ridge * nu * the patches' summed variance per patch column
    rows = patch_rows(avg_pool(p, k), 3)
    mu = ridge * nu * (rows - rows.mean(dim=0)).square().sum() / rows.shape[1]

    def objective(W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        fit = (z - conv_forward(avg_pool(p, k), W, b)).square().sum()
        return (nu / 2) * fit + (tau / 2) * (W - W_old).square().sum() + (mu / 2) * W.square().sum()

    W, b = update_Wb_conv(p, z, W_old, nu, pool=k, tau=tau, ridge=ridge)
    W_expected, b_expected = _argmin(objective, W_old, b_old)
    torch.testing.assert_close(W, W_expected, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(b, b_expected, rtol=1e-7, atol=1e-7)
    gram = centred_gram(patch_rows(avg_pool(p, k), 3))
    torch.testing.assert_close(
        update_Wb_conv(p, z, W_old, nu, pool=k, tau=tau, ridge=ridge, gram=gram), (W, b)
    )


def test_choose_p_solver_and_bad_arguments() -> None:
    # digits' second layer (16 x 4 x 4 after pooling): the explicit matrix is small and cheap
    assert choose_p_solver((16, 4, 4), 32, 3, cg_iters=5) is PSolver.DENSE
    # a 28x28 set's second layer (16 x 14 x 14): too big to build, and CG is cheaper
    assert choose_p_solver((16, 14, 14), 32, 3, cg_iters=5) is PSolver.CG
    W, b, z, q_prev, u_prev = _p_problem(7, 1)
    with pytest.raises(ValueError, match=r"max_iter must be >= 1 \(max_iter: 0\)"):
        update_p_conv(W, b, z, q_prev, u_prev, 1.0, 1.0, max_iter=0)
    with pytest.raises(ValueError, match=r"rho must be > 0 \(rho: 0.0\)"):
        update_p_conv(W, b, z, q_prev, u_prev, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"s odd"):
        update_p_conv(W[..., :2, :2], b, z, q_prev, u_prev, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"z must have shape \[3, 3, 2, 3\]"):
        update_p_conv(W, b, z, q_prev, u_prev, 1.0, 1.0, pool=2)
