"""Batched conjugate gradients against a dense solve of each sample's system."""

from __future__ import annotations

import pytest
import torch

from deepjimu.admm_math.cg import batched_cg

DT = torch.float64


def _spd(n: int, cond: float, g: torch.Generator) -> torch.Tensor:
    Q, _ = torch.linalg.qr(torch.randn(n, n, dtype=DT, generator=g))
    return (
        Q @ torch.diag(torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n, dtype=DT)) @ Q.T
    )


def test_batched_cg_solves_every_sample() -> None:
    g = torch.Generator().manual_seed(0)
    H = _spd(12, 50.0, g)
    rhs = torch.randn(5, 3, 4, dtype=DT, generator=g)  # 5 samples of shape [3, 4]
    sol = batched_cg(
        lambda x: (x.flatten(1) @ H).view_as(x), rhs, torch.zeros_like(rhs), tol=1e-12, max_iter=100
    )
    expected = torch.linalg.solve(H, rhs.flatten(1).T).T.view_as(rhs)
    assert sol.converged and sol.iterations <= 20  # n = 12 in exact arithmetic, plus rounding
    torch.testing.assert_close(sol.x, expected, rtol=1e-9, atol=1e-9)


def test_each_sample_gets_its_own_step_sizes() -> None:
    # Two samples whose right-hand sides live in different eigenvectors of H: per-sample CG
    # solves each in one step; one step size shared by the batch could not.
    H = torch.diag(torch.tensor([1.0, 10.0], dtype=DT))
    rhs = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=DT)
    sol = batched_cg(lambda x: x @ H, rhs, torch.zeros_like(rhs), tol=1e-14, max_iter=5)
    assert sol.converged and sol.iterations == 1
    torch.testing.assert_close(sol.x, torch.tensor([[1.0, 0.0], [0.0, 0.1]], dtype=DT))


def test_warm_start_at_the_solution_takes_no_iteration() -> None:
    g = torch.Generator().manual_seed(1)
    H = _spd(6, 10.0, g)
    x = torch.randn(4, 6, dtype=DT, generator=g)
    sol = batched_cg(lambda v: v @ H, x @ H, x, tol=1e-10, max_iter=10)
    assert sol.converged and sol.iterations == 0
    assert torch.equal(sol.x, x)


def test_cap_is_reported_and_the_iterate_still_improves() -> None:
    g = torch.Generator().manual_seed(2)
    H = _spd(30, 1e4, g)
    rhs = torch.randn(3, 30, dtype=DT, generator=g)
    x0 = torch.zeros_like(rhs)
    sol = batched_cg(lambda v: v @ H, rhs, x0, tol=1e-12, max_iter=3)
    assert not sol.converged and sol.iterations == 3

    def energy(x: torch.Tensor) -> torch.Tensor:  # what CG minimises: x^T H x / 2 - rhs^T x
        return ((x @ H) * x).sum(1) / 2 - (rhs * x).sum(1)

    assert (energy(sol.x) < energy(x0)).all()


def test_zero_right_hand_side_and_bad_arguments() -> None:
    rhs = torch.zeros(2, 3, dtype=DT)
    rhs[1, 0] = 1.0
    sol = batched_cg(lambda v: 2 * v, rhs, torch.zeros_like(rhs), tol=1e-8, max_iter=4)
    assert sol.converged
    torch.testing.assert_close(sol.x, rhs / 2)
    with pytest.raises(ValueError, match=r"x0 must have the shape of rhs \[2, 3\]"):
        batched_cg(lambda v: v, rhs, torch.zeros(2, 4), tol=1e-3, max_iter=1)
    with pytest.raises(ValueError, match=r"max_iter: -1"):
        batched_cg(lambda v: v, rhs, rhs, tol=1e-3, max_iter=-1)
