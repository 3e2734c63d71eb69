"""Preconditioning against dense Kronecker solves; eigen equals inverse; KL clipping's bound."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from deepjimu.kfac.precondition import Eigen, Inverse, decompose, kl_clip_scale

pytestmark = pytest.mark.usefixtures("float64")


def _spd(n: int, seed: int, rank: int | None = None) -> Tensor:
    """A positive semi-definite n x n matrix (singular when ``rank`` < n, as factors of small batches are)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, rank or n, generator=g)
    return m @ m.T / n


def _damped_fisher(a: Tensor, g: Tensor, gamma: float) -> Tensor:
    """(G + gamma I) (x) (A + gamma I): the damped Fisher block acting on row-major vec(grad)."""
    return torch.kron(g + gamma * torch.eye(len(g)), a + gamma * torch.eye(len(a)))


@pytest.mark.parametrize("method", ["eigen", "inverse"])
@pytest.mark.parametrize("singular", [False, True])
def test_preconditioned_gradient_equals_the_dense_solve(method: str, singular: bool) -> None:
    n_a, n_g, gamma = 6, 4, 0.01
    a = _spd(n_a, 0, rank=3 if singular else None)
    g = _spd(n_g, 1, rank=2 if singular else None)
    grad = torch.randn(n_g, n_a, generator=torch.Generator().manual_seed(2))
    dense = torch.linalg.solve(_damped_fisher(a, g, gamma), grad.flatten()).view(n_g, n_a)
    got = decompose(method, a, g, gamma).precondition(grad, gamma)
    assert torch.allclose(got, dense, rtol=1e-9, atol=1e-9)


def test_eigen_and_inverse_forms_agree() -> None:
    a, g, gamma = _spd(9, 3), _spd(5, 4), 0.003
    grad = torch.randn(5, 9, generator=torch.Generator().manual_seed(0))
    eig = decompose("eigen", a, g, gamma).precondition(grad, gamma)
    inv = decompose("inverse", a, g, gamma).precondition(grad, gamma)
    assert torch.allclose(eig, inv, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind", [Eigen, Inverse])
def test_decompositions_pack_and_unpack(kind: type) -> None:
    a, g = _spd(4, 5), _spd(3, 6)
    d = decompose(kind.method, a, g, 0.1)
    flat = d.pack()
    assert flat.shape == (kind.numel(4, 3),)
    back = kind.unpack(flat, 4, 3)
    grad = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(back.precondition(grad, 0.1), d.precondition(grad, 0.1), rtol=1e-12)


@pytest.mark.parametrize(("kl_clip", "clipped"), [(1e-3, True), (1e4, False)])
def test_kl_clipping_bounds_the_steps_kl_estimate(kl_clip: float, clipped: bool) -> None:
    """nu scales the step so that Delta^T F Delta = nu^2 lr^2 sum grad'.grad <= kl_clip, F dense."""
    gamma, lr = 0.01, 0.3
    layers = [(_spd(4, 7), _spd(3, 8)), (_spd(5, 9), _spd(2, 10))]
    gen = torch.Generator().manual_seed(11)
    grads = [torch.randn(3, 4, generator=gen), torch.randn(2, 5, generator=gen)]
    pre = [
        decompose("eigen", a, g, gamma).precondition(gr, gamma)
        for (a, g), gr in zip(layers, grads, strict=True)
    ]
    nu = kl_clip_scale(list(zip(pre, grads, strict=True)), lr, kl_clip)
    kl = sum(
        float((lr * nu * p).flatten() @ _damped_fisher(a, g, gamma) @ (lr * nu * p).flatten())
        for (a, g), p in zip(layers, pre, strict=True)
    )
    if clipped:
        assert nu < 1 and kl == pytest.approx(kl_clip, rel=1e-9)
    else:
        assert nu == 1.0 and kl <= kl_clip
    assert kl_clip_scale(list(zip(pre, grads, strict=True)), lr, 0.0) == 1.0
