"""Each pdADMM update against an independent numerical minimisation of its objective."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from deepjimu.admm_math.updates import (
    GRAM_CHUNK,
    LayerVars,
    augmented_lagrangian,
    batch_stats,
    by_rows,
    centred_gram,
    combine_stats,
    extrapolate,
    extrapolate_into,
    fit_term,
    last_layer_objective,
    layer_lagrangian,
    layer_terms,
    merge_stats,
    primal_residual,
    remove_stats,
    ridge_weight,
    samples_side,
    update_p,
    update_q,
    update_u,
    update_Wb,
    update_Wb_stats,
    update_z_hidden,
    update_z_last,
)

N = 7
DT = torch.float64


def _randn(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, dtype=DT, generator=generator)


def _argmin(f: Callable[..., torch.Tensor], *x0: torch.Tensor) -> list[torch.Tensor]:
    """Minimise f with L-BFGS to high precision (independent of the closed forms)."""
    xs = [x.detach().clone().requires_grad_(True) for x in x0]
    opt = torch.optim.LBFGS(
        xs,
        lr=1,
        max_iter=5000,
        tolerance_grad=1e-13,
        tolerance_change=1e-18,
        history_size=50,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = f(*xs)
        loss.backward()
        return loss

    opt.step(closure)
    return [x.detach() for x in xs]


def _grad(f: Callable[..., torch.Tensor], *x: torch.Tensor) -> list[torch.Tensor]:
    xs = [t.detach().clone().requires_grad_(True) for t in x]
    return list(torch.autograd.grad(f(*xs), xs))


def _fit(p: torch.Tensor, W: torch.Tensor, b: torch.Tensor, z: torch.Tensor, nu: float):
    return (nu / 2) * ((z - p @ W.T - b) ** 2).sum()


def test_update_p_is_the_minimiser() -> None:
    g = torch.Generator().manual_seed(0)
    n_in, n_out, rho, nu = 4, 3, 0.7, 1.3
    W, b, z = (
        _randn(n_out, n_in, generator=g),
        _randn(n_out, generator=g),
        _randn(N, n_out, generator=g),
    )
    q_prev, u_prev = _randn(N, n_in, generator=g), _randn(N, n_in, generator=g)

    def phi(p: torch.Tensor) -> torch.Tensor:
        r = p - q_prev
        return _fit(p, W, b, z, nu) + (u_prev * r).sum() + (rho / 2) * (r**2).sum()

    p = update_p(W, b, z, q_prev, u_prev, rho, nu)
    (expected,) = _argmin(phi, torch.zeros(N, n_in, dtype=DT))
    torch.testing.assert_close(p, expected, rtol=1e-8, atol=1e-8)
    assert _grad(phi, p)[0].abs().max() < 1e-10


def _paper_W_then_b(
    p: torch.Tensor,
    b: torch.Tensor,
    z: torch.Tensor,
    W_old: torch.Tensor,
    nu: float,
    mu: float,
    tau: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's two steps: W minimising the fit at the old b, then b at that W (dense solves)."""
    n_in = p.shape[1]
    gram = nu * p.T @ p + (mu + tau) * torch.eye(n_in, dtype=p.dtype)
    W = torch.linalg.solve(gram, (nu * (z - b).T @ p + tau * W_old).T).T
    return W, (z - p @ W.T).mean(dim=0)


def test_update_Wb_with_singular_gram_is_the_minimum_norm_minimiser() -> None:
    g = torch.Generator().manual_seed(2)
    n_in, n_out, nu = 4, 3, 1.0
    p = _randn(N, n_in, generator=g)
    p[:, 2] = 1.5  # a constant input feature: the centred p^T p is singular
    z, W_old = _randn(N, n_out, generator=g), _randn(n_out, n_in, generator=g)
    W, b = update_Wb(p, z, W_old, nu)
    assert torch.isfinite(W).all() and torch.isfinite(b).all()
    grads = _grad(lambda w, b_: _fit(p, w, b_, z, nu), W, b)
    assert max(gr.abs().max() for gr in grads) < 1e-10
    assert W[:, 2].abs().max() < 1e-12


@pytest.mark.parametrize(
    ("mu", "tau", "ridge"),
    [(0.0, 0.0, 0.0), (0.3, 0.0, 0.0), (0.0, 0.5, 0.0), (0.0, 0.0, 0.01), (0.2, 0.5, 0.3)],
)
def test_update_Wb_is_the_joint_minimiser(mu: float, tau: float, ridge: float) -> None:
    """The relative ridge's weight is ridge * nu * (mean input variance) * N, written out here."""
    g = torch.Generator().manual_seed(5)
    n_in, n_out, nu = 4, 3, 1.1
    # non-centred input (W and b are coupled), features of very different variance
    p = _randn(N, n_in, generator=g) * torch.tensor([3.0, 1.0, 0.1, 0.01], dtype=DT) + 2.0
    z, W_old, b_old = (
        _randn(N, n_out, generator=g),
        _randn(n_out, n_in, generator=g),
        _randn(n_out, generator=g),
    )
    mu_ridge = ridge * nu * ((p - p.mean(dim=0)) ** 2).sum() / n_in
    mu_all = mu + mu_ridge

    def objective(W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (
            _fit(p, W, b, z, nu)
            + (mu_all / 2) * (W**2).sum()
            + (tau / 2) * ((W - W_old) ** 2).sum()
        )

    W, b = update_Wb(p, z, W_old, nu, mu=mu, tau=tau, ridge=ridge)
    W_expected, b_expected = _argmin(objective, W_old, b_old)
    torch.testing.assert_close(W, W_expected, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(b, b_expected, rtol=1e-7, atol=1e-7)
    W_seq, b_seq = _paper_W_then_b(p, b_old, z, W_old, nu, float(mu_all), tau)
    assert objective(W, b) <= objective(W_seq, b_seq) + 1e-12
    W2, b2 = update_Wb(p, z, W_old, nu, mu=mu, tau=tau, ridge=ridge, gram=centred_gram(p))
    torch.testing.assert_close((W2, b2), (W, b))
    torch.testing.assert_close(ridge_weight(centred_gram(p), nu, ridge), mu_ridge)


def _inputs_side(
    p: torch.Tensor,
    z: torch.Tensor,
    W_old: torch.Tensor,
    nu: float,
    mu: float,
    tau: float,
    ridge: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The n_in x n_in normal equations W (nu G + d I) = nu z_c^T p_c + tau W_old, written out
    (the minimum-norm solution by the pseudo-inverse where d = 0)."""
    n_in = p.shape[1]
    pc, zc = p - p.mean(dim=0), z - z.mean(dim=0)
    G = pc.T @ pc
    d = ridge * nu * torch.trace(G) / n_in + mu + tau
    A, B = nu * G + d * torch.eye(n_in, dtype=p.dtype), nu * zc.T @ pc + tau * W_old
    W = B @ torch.linalg.pinv(A, hermitian=True) if d == 0 else torch.linalg.solve(A, B.T).T
    return W, z.mean(dim=0) - W @ p.mean(dim=0)


@pytest.mark.parametrize(("n_samples", "n_in"), [(6, 15), (15, 6), (9, 9)])
@pytest.mark.parametrize(
    ("mu", "tau", "ridge"), [(0.0, 0.0, 0.0), (0.0, 0.5, 0.0), (0.0, 0.0, 0.01), (0.2, 0.5, 0.3)]
)
def test_update_Wb_on_either_side_is_the_normal_equations_minimiser(
    n_samples: int, n_in: int, mu: float, tau: float, ridge: float
) -> None:
    """Fewer samples than inputs: the N x N kernel solve gives the n_in x n_in solve's (W, b),
    with the same ridge and proximal term (at d = 0 the same minimum-norm minimiser); more
    samples: the n_in x n_in solve, as before. Inputs with a mean, several scales."""
    g = torch.Generator().manual_seed(21)
    n_out, nu = 4, 1.3
    scale = torch.logspace(0, -1, n_in, dtype=DT)
    p = _randn(n_samples, n_in, generator=g) * scale + 2.0
    z, W_old = _randn(n_samples, n_out, generator=g), _randn(n_out, n_in, generator=g)
    assert samples_side(n_samples, n_in) == (n_samples <= n_in)
    W, b = update_Wb(p, z, W_old, nu, mu=mu, tau=tau, ridge=ridge)
    W_ref, b_ref = _inputs_side(p, z, W_old, nu, mu, tau, ridge)
    torch.testing.assert_close(W, W_ref, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(b, b_ref, rtol=1e-9, atol=1e-10)
    if mu == 0:  # the O(n_in^2) statistics of mini-batch mode solve on the inputs' side
        W_st, b_st = update_Wb_stats(batch_stats(p, z), W_old, nu, tau=tau, ridge=ridge)
        torch.testing.assert_close((W, b), (W_st, b_st), rtol=1e-9, atol=1e-10)
    gram = centred_gram(p)
    side = min(n_samples, n_in)
    assert gram.shape == (side, side)
    torch.testing.assert_close(
        update_Wb(p, z, W_old, nu, mu=mu, tau=tau, ridge=ridge, gram=gram), (W, b)
    )
    pc = p - p.mean(dim=0)
    torch.testing.assert_close(
        ridge_weight(gram, nu, ridge, n_in), ridge_weight(pc.T @ pc, nu, ridge)
    )


def test_update_Wb_on_the_samples_side_keeps_its_accuracy_in_float32_and_bf16() -> None:
    """140 ReLU-like rows of 1,000 inputs with a large mean (Cora's shape, smaller): the kernel
    solve in float32, and under bf16 autocast, stays near the float64 minimiser."""
    g = torch.Generator().manual_seed(22)
    n, n_in, n_out = 140, 1000, 16
    p = (torch.randn(n, n_in, generator=g).relu() + 4.0).float()
    z = p @ (torch.randn(n_out, n_in, generator=g) / 30).T + 0.1 * torch.randn(
        n, n_out, generator=g
    )
    W_old = torch.randn(n_out, n_in, generator=g) / 30
    W64, b64 = _inputs_side(p.double(), z.double(), W_old.double(), 1.0, 0.0, 1.0, 0.01)
    W32, b32 = update_Wb(p, z, W_old, 1.0, tau=1.0, ridge=0.01)
    assert W32.dtype == torch.float32
    assert float((W32.double() - W64).norm() / W64.norm()) < 1e-4
    assert float((b32.double() - b64).norm() / b64.norm()) < 1e-3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        W, b = update_Wb(p, z, W_old, nu=1.0, tau=1.0, ridge=0.01)
    assert W.dtype == b.dtype == torch.float32
    assert float((W.double() - W64).norm() / W64.norm()) < 0.05


def test_relative_ridge_is_scale_free() -> None:
    """Inputs c times larger (a layer with larger activations) give W / c: the same fit."""
    g = torch.Generator().manual_seed(16)
    p, z = _randn(N, 4, generator=g), _randn(N, 3, generator=g)
    W0 = torch.zeros(3, 4, dtype=DT)
    W, b = update_Wb(p, z, W0, 0.9, ridge=0.05)
    W_c, b_c = update_Wb(100.0 * p, z, W0, 0.9, ridge=0.05)
    torch.testing.assert_close(W_c, W / 100.0, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(b_c, b, rtol=1e-10, atol=1e-12)


def test_relative_ridge_is_the_least_squares_of_noisy_inputs() -> None:
    """Bishop (1995): least squares on inputs plus isotropic noise of variance s^2 = ridge times the
    inputs' mean variance tends to the ridge solution (Monte Carlo over many noisy copies)."""
    g = torch.Generator().manual_seed(17)
    n_in, ridge, copies = 3, 0.2, 20000
    p = _randn(N, n_in, generator=g) * torch.tensor([2.0, 1.0, 0.3], dtype=DT)
    z = _randn(N, 2, generator=g)
    variance = ((p - p.mean(dim=0)) ** 2).sum() / (N * n_in)
    noisy = p.repeat(copies, 1) + _randn(copies * N, n_in, generator=g) * (ridge * variance).sqrt()
    W_noise, b_noise = update_Wb(noisy, z.repeat(copies, 1), torch.zeros(2, n_in, dtype=DT), 1.0)
    W, b = update_Wb(p, z, torch.zeros(2, n_in, dtype=DT), 1.0, ridge=ridge)
    torch.testing.assert_close(W_noise, W, rtol=0.05, atol=0.02)
    torch.testing.assert_close(b_noise, b, rtol=0.05, atol=0.02)


@pytest.mark.parametrize("decay", [0.0, 0.5, 1.0])
def test_update_Wb_stats_is_the_minimiser_over_every_decayed_batch(decay: float) -> None:
    """Three batches summarised in O(n^2) statistics give the exact weighted (W, b) minimiser."""
    g = torch.Generator().manual_seed(8)
    n_in, n_out, nu, tau = 4, 3, 0.7, 0.4
    batches = [(_randn(5, n_in, generator=g) + k, _randn(5, n_out, generator=g)) for k in range(3)]
    W_old, b0 = _randn(n_out, n_in, generator=g), torch.zeros(n_out, dtype=DT)
    stats = None
    for p, z in batches:
        stats = combine_stats(stats, p, z, decay)
    assert stats is not None
    W, b = update_Wb_stats(stats, W_old, nu, tau=tau)

    def objective(W_: torch.Tensor, b_: torch.Tensor) -> torch.Tensor:
        total = (tau / 2) * ((W_ - W_old) ** 2).sum()
        for k, (p, z) in enumerate(batches):  # batch k's weight: decay^(number of later batches)
            total = total + decay ** (len(batches) - 1 - k) * _fit(p, W_, b_, z, nu)
        return total

    W_expected, b_expected = _argmin(objective, W_old, b0)
    torch.testing.assert_close(W, W_expected, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(b, b_expected, rtol=1e-7, atol=1e-7)
    p_last, z_last = batches[-1]  # one batch: the same step as update_Wb
    torch.testing.assert_close(
        update_Wb_stats(combine_stats(None, p_last, z_last, decay), W_old, nu, tau=tau),
        update_Wb(p_last, z_last, W_old, nu, tau=tau),
    )
    torch.testing.assert_close(  # the ridge is the same function of the statistics' Gram
        update_Wb_stats(combine_stats(None, p_last, z_last, decay), W_old, nu, ridge=0.1),
        update_Wb(p_last, z_last, W_old, nu, ridge=0.1),
    )
    with pytest.raises(ValueError, match="decay must be in"):
        combine_stats(None, *batches[0], 1.5)


def test_remove_stats_undoes_merge_stats() -> None:
    """Removing a batch from a total leaves the statistics of the other samples, exactly."""
    g = torch.Generator().manual_seed(10)
    p, z = _randn(12, 4, generator=g) + 3, _randn(12, 2, generator=g) - 1
    rest, part = batch_stats(p[:7], z[:7]), batch_stats(p[7:], z[7:])
    total = merge_stats(rest, part)
    for got, want in ((total, batch_stats(p, z)), (remove_stats(total, part), rest)):
        assert got is not None and got.n == want.n
        for field in ("p_mean", "z_mean", "C_pp", "C_zp"):
            torch.testing.assert_close(getattr(got, field), getattr(want, field))
    assert remove_stats(part, part) is None  # nothing left
    with pytest.raises(ValueError, match="cannot remove 12 samples from 5"):
        remove_stats(part, total)


def test_extrapolation_keeps_fixed_points_and_is_linear() -> None:
    g = torch.Generator().manual_seed(9)
    x, x_prev = _randn(3, 2, generator=g), _randn(3, 2, generator=g)
    torch.testing.assert_close(extrapolate(x, x, 0.7), x)  # a fixed point stays one
    torch.testing.assert_close(extrapolate(x, x_prev, 0.0), x)
    torch.testing.assert_close(extrapolate(x, x_prev, 0.5), 1.5 * x - 0.5 * x_prev)


def test_extrapolation_into_the_record_is_bit_for_bit_and_allocates_nothing() -> None:
    g = torch.Generator().manual_seed(10)
    x, x_prev = _randn(64, 33, generator=g), _randn(64, 33, generator=g)
    want, record, x_before = extrapolate(x, x_prev, 0.7), x_prev.clone(), x.clone()
    got = extrapolate_into(x, record, 0.7)
    assert got.data_ptr() == record.data_ptr()  # written over the record
    assert torch.equal(got, want)  # the same operations: equal bits, not just close
    assert torch.equal(x, x_before)  # x itself untouched


def test_update_Wb_keeps_its_accuracy_under_bf16_autocast() -> None:
    """ReLU-like inputs with a large mean: the centred Gram must not come from a rounded p^T p.

    Subtracting N m m^T from a bf16 p^T p cancels most of its bits (W was off by 430% and
    b by 25,000% when the products were centred after the matmul); centring p first keeps
    W within a few percent of the float64 solve, and the objective within a few percent of
    its minimum (b = mean z - W m inherits W's error times the large mean m).
    """
    g = torch.Generator().manual_seed(8)
    n, n_in, n_out = 2000, 64, 32
    p = (torch.randn(n, n_in, generator=g).relu() + 4.0).float()
    W_true = torch.randn(n_out, n_in, generator=g) / 8
    z = p @ W_true.T + 0.5 + 0.1 * torch.randn(n, n_out, generator=g)
    W_old = torch.zeros(n_out, n_in)
    W64, b64 = update_Wb(p.double(), z.double(), W_old.double(), nu=1.0, tau=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        W, b = update_Wb(p, z, W_old, nu=1.0, tau=1.0)
    assert W.dtype == b.dtype == torch.float32
    assert float((W.double() - W64).norm() / W64.norm()) < 0.05

    def objective(W: torch.Tensor, b: torch.Tensor) -> float:
        W, b = W.double(), b.double()
        fit = ((z.double() - p.double() @ W.T - b) ** 2).sum() / 2
        return float(fit + ((W - W_old.double()) ** 2).sum() / 2)

    assert objective(W, b) < 1.05 * objective(W64, b64)


def test_update_Wb_keeps_a_fixed_point_over_a_million_float32_rows() -> None:
    """The rows of a conv layer's W-step are N H W patches: millions in float32.

    Sparse, non-negative inputs like image patches (most pixels 0) and z = p W^T + b: the
    exact step returns (W, b) unchanged. A float32 GEMM summing a million rows in float32
    moved W 0.8% here (13% on MNIST 28x28 patches, which made cnn:16-32 collapse); the
    Gram and z^T p summed from chunks in float64 keep it within 1e-4.
    """
    g = torch.Generator().manual_seed(10)
    p = torch.relu(torch.rand(1_000_000, 9, generator=g) - 0.8) * 5
    W, b = torch.randn(4, 9, generator=g), torch.randn(4, generator=g)
    W_new, b_new = update_Wb(p, p @ W.T + b, W, nu=1.0, tau=1.0)
    assert float((W_new - W).norm() / W.norm()) < 1e-4
    assert float((b_new - b).norm() / b.norm()) < 1e-4
    # up to one chunk of rows the products are the plain ones, bit for bit
    few = p[:GRAM_CHUNK]
    assert torch.equal(centred_gram(few), (few - few.mean(0)).T @ (few - few.mean(0)))


def _z_hidden_objective(z, a, q, z_old):
    return (z - a) ** 2 + (q - torch.relu(z)) ** 2 + (z - z_old) ** 2


def test_update_z_hidden_matches_elementwise_grid_search() -> None:
    g = torch.Generator().manual_seed(6)
    a, q, z_old = (2 * _randn(N, 5, generator=g) for _ in range(3))
    z = update_z_hidden(a, q, z_old)
    assert (z > 0).any() and (z < 0).any()  # both branches are exercised

    grid = torch.linspace(-12, 12, 240_001, dtype=DT)  # spacing 1e-4
    f_grid = _z_hidden_objective(
        grid[:, None], a.reshape(1, -1), q.reshape(1, -1), z_old.reshape(1, -1)
    )
    best = f_grid.min(dim=0)
    f_closed = _z_hidden_objective(z, a, q, z_old).reshape(-1)
    assert (f_closed <= best.values + 1e-12).all()
    assert (f_closed >= best.values - 1e-7).all()  # no better point exists off the grid
    torch.testing.assert_close(z.reshape(-1), grid[best.indices], rtol=0, atol=1e-4)


def test_update_z_hidden_on_many_rows_equals_it_row_block_by_row_block() -> None:
    # more rows than one block of by_rows: the blocks' results are the whole's, bit for bit
    g = torch.Generator().manual_seed(8)
    a, q, z_old = (2 * torch.randn(3001, 40, generator=g) for _ in range(3))
    whole = update_z_hidden(a, q, z_old)
    for lo, hi in ((0, 1), (1000, 1700), (2999, 3001)):
        assert torch.equal(whole[lo:hi], update_z_hidden(a[lo:hi], q[lo:hi], z_old[lo:hi]))
    assert torch.equal(by_rows(lambda t: t * 2, a), a * 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_layer_terms_summed_by_row_blocks_are_the_formulas(dtype: torch.dtype) -> None:
    # more rows than one block of sum_by_rows, whose partial sums are added in float64
    g = torch.Generator().manual_seed(9)
    a, z, q, u, p_next = (torch.randn(3001, 40, generator=g, dtype=torch.float64) for _ in range(5))
    rho, nu = 0.3, 1.7
    r = p_next - q
    want = (
        (nu / 2) * ((z - a) ** 2).sum()
        + (nu / 2) * ((q - torch.relu(z)) ** 2).sum()
        + (u * r).sum()
        + (rho / 2) * (r**2).sum()
    )
    ts = [t.to(dtype) for t in (a, z, q, u, p_next)]
    obj, rr = layer_terms(fit_term(ts[0], ts[1]), *ts[1:], rho, nu)
    assert obj.dtype == rr.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(obj.double(), want, rtol=tol, atol=0)
    torch.testing.assert_close(rr.double(), (r**2).sum(), rtol=tol, atol=0)
    # layer_lagrangian, from a: the same sums
    assert torch.equal(layer_lagrangian(*ts, rho, nu), obj)


def test_update_z_hidden_beats_local_minimisation_from_many_starts() -> None:
    g = torch.Generator().manual_seed(7)
    a, q, z_old = (2 * _randn(N, 4, generator=g) for _ in range(3))
    z = update_z_hidden(a, q, z_old)
    f_closed = _z_hidden_objective(z, a, q, z_old).sum()
    for start in (-5.0, -0.5, 0.5, 5.0):
        (local,) = _argmin(
            lambda t: _z_hidden_objective(t, a, q, z_old).sum(), torch.full_like(a, start)
        )
        assert f_closed <= _z_hidden_objective(local, a, q, z_old).sum() + 1e-10


@pytest.mark.parametrize("prox", [False, True])
@pytest.mark.parametrize("nu", [1.0, 1e-2])
def test_update_z_last_is_the_minimiser(prox: bool, nu: float) -> None:
    g = torch.Generator().manual_seed(8)
    C = 4
    a, z_old = 3 * _randn(N, C, generator=g), _randn(N, C, generator=g)
    y = torch.randint(0, C, (N,), generator=g)

    def objective(z: torch.Tensor) -> torch.Tensor:
        f = F.cross_entropy(z, y, reduction="sum") + (nu / 2) * ((z - a) ** 2).sum()
        return f + (nu / 2) * ((z - z_old) ** 2).sum() if prox else f

    result = update_z_last(a, y, z_old, nu, prox=prox, tol=1e-10)
    assert result.converged and result.iterations <= 10  # Newton: quadratic convergence
    assert _grad(objective, result.z)[0].abs().max() < 1e-10
    (expected,) = _argmin(objective, z_old)
    torch.testing.assert_close(result.z, expected, rtol=1e-6, atol=1e-6)


def test_update_z_last_small_nu_and_float32_converge() -> None:
    g = torch.Generator().manual_seed(9)
    a, z_old = torch.randn(50, 10, generator=g), torch.randn(50, 10, generator=g)
    y = torch.randint(0, 10, (50,), generator=g)
    result = update_z_last(a, y, z_old, 1e-4)
    assert result.converged and result.iterations <= 15
    assert result.z.dtype == torch.float32


def test_update_z_last_reports_the_iteration_cap() -> None:
    g = torch.Generator().manual_seed(10)
    a, z_old = _randn(N, 3, generator=g), _randn(N, 3, generator=g)
    y = torch.randint(0, 3, (N,), generator=g)
    result = update_z_last(a, y, z_old, 1e-3, tol=1e-12, max_iter=1)
    assert not result.converged and result.iterations == 1
    objective = last_layer_objective(a, result.z, y, 1e-3)
    assert objective < last_layer_objective(a, z_old, y, 1e-3)


def test_update_q_is_the_minimiser() -> None:
    g = torch.Generator().manual_seed(11)
    p_next, u, z = (_randn(N, 3, generator=g) for _ in range(3))
    rho, nu = 0.6, 1.7

    def objective(q: torch.Tensor) -> torch.Tensor:
        r = p_next - q
        return (
            (nu / 2) * ((q - torch.relu(z)) ** 2).sum() + (u * r).sum() + (rho / 2) * (r**2).sum()
        )

    (expected,) = _argmin(objective, torch.zeros_like(p_next))
    torch.testing.assert_close(update_q(p_next, u, z, rho, nu), expected, rtol=1e-8, atol=1e-8)


def test_update_u_is_dual_ascent() -> None:
    layers, y, rho, nu = _three_layer_problem(12)
    before = augmented_lagrangian(layers, y, rho, nu)
    r = layers[1].p - layers[0].q
    layers[0].u = update_u(layers[0].u, layers[1].p, layers[0].q, rho)
    # The Lagrangian is linear in u with gradient p_next - q.
    torch.testing.assert_close(
        augmented_lagrangian(layers, y, rho, nu) - before, rho * (r**2).sum()
    )


def _three_layer_problem(seed: int) -> tuple[list[LayerVars], torch.Tensor, float, float]:
    g = torch.Generator().manual_seed(seed)
    sizes = [5, 4, 4, 3]
    layers = []
    for n_in, n_out in itertools.pairwise(sizes):
        layers.append(
            LayerVars(
                p=_randn(N, n_in, generator=g),
                W=_randn(n_out, n_in, generator=g),
                b=_randn(n_out, generator=g),
                z=_randn(N, n_out, generator=g),
                q=_randn(N, n_out, generator=g),
                u=_randn(N, n_out, generator=g),
            )
        )
    layers[-1].q = layers[-1].u = None
    y = torch.randint(0, sizes[-1], (N,), generator=g)
    return layers, y, 0.9, 0.5


def test_augmented_lagrangian_matches_problem_2() -> None:
    layers, y, rho, nu = _three_layer_problem(13)
    expected = F.cross_entropy(layers[2].z, y, reduction="sum")
    for layer, right in zip(layers, [*layers[1:], None], strict=True):
        expected = expected + (nu / 2) * ((layer.z - layer.p @ layer.W.T - layer.b) ** 2).sum()
        if right is not None:
            r = right.p - layer.q
            expected = expected + (nu / 2) * ((layer.q - layer.z.clamp(min=0)) ** 2).sum()
            expected = expected + (layer.u * r).sum() + (rho / 2) * (r**2).sum()
    torch.testing.assert_close(augmented_lagrangian(layers, y, rho, nu), expected)
    a0 = layers[0].p @ layers[0].W.T + layers[0].b
    term = layer_lagrangian(a0, layers[0].z, layers[0].q, layers[0].u, layers[1].p, rho, nu)
    assert term > 0
    residual = ((layers[1].p - layers[0].q) ** 2).sum() + ((layers[2].p - layers[1].q) ** 2).sum()
    torch.testing.assert_close(primal_residual(layers), residual.sqrt())


def _apply_and_compare(layers, y, rho, nu, step) -> None:
    before = augmented_lagrangian(layers, y, rho, nu)
    step(layers)
    after = augmented_lagrangian(layers, y, rho, nu)
    assert after <= before + 1e-12, (before.item(), after.item())
    assert after < before - 1e-6  # the step does something


def _p_step(layers: list[LayerVars], rho: float, nu: float) -> None:
    new = [
        update_p(layer.W, layer.b, layer.z, left.q, left.u, rho, nu)
        for left, layer in itertools.pairwise(layers)
    ]
    for layer, p in zip(layers[1:], new, strict=True):
        layer.p = p


def _wb_step(layers: list[LayerVars], nu: float) -> None:
    for layer in layers:
        layer.W, layer.b = update_Wb(layer.p, layer.z, layer.W, nu)


def _z_step(layers: list[LayerVars], y: torch.Tensor, nu: float) -> None:
    for layer in layers[:-1]:
        layer.z = update_z_hidden(layer.p @ layer.W.T + layer.b, layer.q, layer.z)
    last = layers[-1]
    last.z = update_z_last(last.p @ last.W.T + last.b, y, last.z, nu).z


def _q_step(layers: list[LayerVars], rho: float, nu: float) -> None:
    for layer, right in itertools.pairwise(layers):
        layer.q = update_q(right.p, layer.u, layer.z, rho, nu)


@pytest.mark.parametrize("step", ["p", "Wb", "z", "q"])
def test_augmented_lagrangian_does_not_increase(step: str) -> None:
    layers, y, rho, nu = _three_layer_problem(14)
    steps = {
        "p": lambda ls: _p_step(ls, rho, nu),
        "Wb": lambda ls: _wb_step(ls, nu),
        "z": lambda ls: _z_step(ls, y, nu),
        "q": lambda ls: _q_step(ls, rho, nu),
    }
    _apply_and_compare(layers, y, rho, nu, steps[step])


def test_iterations_drive_the_primal_residual_down() -> None:
    layers, y, rho, nu = _three_layer_problem(15)
    assert primal_residual(layers) > 3
    for _ in range(15):
        _p_step(layers, rho, nu)
        _wb_step(layers, nu)
        _z_step(layers, y, nu)
        _q_step(layers, rho, nu)
        for layer, right in itertools.pairwise(layers):
            layer.u = update_u(layer.u, right.p, layer.q, rho)
    assert primal_residual(layers) < 0.1


def test_shape_and_parameter_errors_name_the_bad_values() -> None:
    W, b, z = torch.zeros(3, 4), torch.zeros(3), torch.zeros(N, 3)
    with pytest.raises(ValueError, match=r"q_prev must have shape \[7, 4\] \(got \[7, 3\]\)"):
        update_p(W, b, z, torch.zeros(N, 3), torch.zeros(N, 4), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"rho must be > 0 \(rho: 0.0\)"):
        update_p(W, b, z, torch.zeros(N, 4), torch.zeros(N, 4), 0.0, 1.0)
    with pytest.raises(ValueError, match=r"tau must be >= 0 \(tau: -1.0\)"):
        update_Wb(torch.zeros(N, 4), z, W, 1.0, tau=-1.0)
    with pytest.raises(ValueError, match=r"y must have shape \[7\]"):
        update_z_last(z, torch.zeros(6, dtype=torch.long), z, 1.0)
