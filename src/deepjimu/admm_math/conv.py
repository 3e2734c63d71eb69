"""pdADMM subproblems of a convolutional layer z = conv(P p, W) + b, P a fixed average pooling.

Layout (samples first, channels before space, as ``nn.Conv2d``):

    p, q_prev, u_prev [N, C_in, H_in, W_in]   the previous layer's ReLU output, NOT pooled
    P p               [N, C_in, H, W]         avg_pool(p, k): H = H_in // k (k = 1: P = I)
    W [C_out, C_in, s, s]   b [C_out]         odd square kernel s, stride 1, 'same' zero padding
    z, a = conv(P p, W) + b  [N, C_out, H, W]

The pooling of block l-1 is folded into the operator of layer l (A = conv o P), so no new
variable is needed and z, q, u keep their elementwise updates in ``updates.py``. The final
classifier is a dense layer on flatten(P p): its steps are ``updates.update_Wb`` on the
flattened pooled input and :func:`update_p_flat`.

**Pooling fold.** Non-overlapping k x k average pooling has P P^T = I / k^2. Write the p-step
as min (nu/2)||z - b - A P p||^2 + (rho/2)||p - v||^2 with v = q_prev - u_prev / rho. The part
of p in the null space of P does not touch the fit, so it stays that of v, and p = v + P^T w.
With x = P p this is exactly

    x* = argmin (nu/2)||z - b - A x||^2 + (k^2 rho / 2)||x - P v||^2,
    p  = v + k^2 P^T (x* - P v)   (k^2 P^T: nearest-neighbour upsampling, zeros where pooling
                                   dropped an odd last row or column),

the un-pooled p-step on the k^2-times smaller map with rho scaled by k^2 (better conditioned).

**p-step solvers.** The Hessian nu A^T A + rho I is the same for every sample, so the N
problems are independent. ``PSolver.CG`` runs matrix-free conjugate gradients with conv2d and
conv_transpose2d (about 4 N H W C_in C_out s^2 flops per iteration), warm-started from the
current P p. ``PSolver.DENSE`` builds A as an explicit (C_out H W) x (C_in H W) matrix and
calls ``updates.update_p`` (one small factorisation, then one GEMM over the N samples): exact,
and cheaper than a few CG iterations while the map is small (see :func:`choose_p_solver`).
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from deepjimu.admm_math import updates as U
from deepjimu.admm_math.cg import batched_cg

# the argument checks of updates.py, so both modules word their errors alike
_check_shape, _check_positive = U._check_shape, U._check_positive

__all__ = [
    "ConvPSolve",
    "PSolver",
    "avg_pool",
    "avg_pool_adjoint",
    "choose_p_solver",
    "conv_adjoint",
    "conv_forward",
    "conv_matrix",
    "conv_p_flops",
    "patch_rows",
    "update_Wb_conv",
    "update_p_conv",
    "update_p_flat",
]


class PSolver(str, enum.Enum):
    """How :func:`update_p_conv` solves the p-subproblem."""

    CG = "cg"
    """Matrix-free conjugate gradients (conv2d / conv_transpose2d), warm-started, capped."""
    DENSE = "dense"
    """The conv as an explicit matrix and ``updates.update_p``'s exact solve."""


class ConvPSolve(NamedTuple):
    """Result of :func:`update_p_conv`: the new p, CG iterations run (0 for DENSE), converged."""

    p: Tensor
    iterations: int
    converged: bool


def _check_kernel(W: Tensor) -> int:
    s = W.shape[-1]
    if W.dim() != 4 or W.shape[-2] != s or s % 2 == 0:
        raise ValueError(f"W must be [C_out, C_in, s, s] with s odd (got {list(W.shape)})")
    return s


def avg_pool(p: Tensor, k: int) -> Tensor:
    """P p: non-overlapping k x k average pooling (floor mode); the identity for k = 1."""
    return F.avg_pool2d(p, k) if k > 1 else p


def avg_pool_adjoint(x: Tensor, k: int, size: tuple[int, int]) -> Tensor:
    """P^T x: each pooled value / k^2 spread over its k x k window; zeros where pooling dropped rows.

    Args:
        x: a pooled map, [N, C, H, W].
        k: pool size, >= 1.
        size: (H_in, W_in) of the un-pooled map; H_in // k must be H.

    Returns:
        [N, C, H_in, W_in].
    """
    if k == 1:
        return x
    up = x.repeat_interleave(k, dim=2).repeat_interleave(k, dim=3) / (k * k)
    return F.pad(up, (0, size[1] - up.shape[3], 0, size[0] - up.shape[2]))


def conv_forward(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    """A x (+ b): 'same' convolution, stride 1, as ``nn.Conv2d(padding=s // 2)``."""
    return F.conv2d(x, W, b, padding=_check_kernel(W) // 2)


def conv_adjoint(y: Tensor, W: Tensor) -> Tensor:
    """A^T y: the adjoint of :func:`conv_forward` without bias (a transposed convolution)."""
    return F.conv_transpose2d(y, W, padding=_check_kernel(W) // 2)


def conv_matrix(W: Tensor, shape: tuple[int, int, int]) -> Tensor:
    """The conv on maps of ``shape`` = (C_in, H, W) as an explicit matrix [C_out H W, C_in H W].

    Built by convolving the identity basis (C_in H W one-hot maps): C_in H W single-map convs.
    """
    n = math.prod(shape)
    basis = torch.eye(n, dtype=W.dtype, device=W.device).view(n, *shape)
    return conv_forward(basis, W).reshape(n, -1).T


def patch_rows(x: Tensor, s: int) -> Tensor:
    """im2col of a map x [N, C, H, W] for an s x s 'same' conv: rows [N H W, C s^2], pixel-major.

    Row order matches ``z.permute(0, 2, 3, 1).reshape(-1, C_out)`` and column order matches
    ``W.reshape(C_out, -1)``, so the conv is ``rows @ W.reshape(C_out, -1).T``.
    """
    cols = F.unfold(x, s, padding=s // 2)  # [N, C s^2, H W]
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def update_Wb_conv(
    p: Tensor,
    z: Tensor,
    W: Tensor,
    nu: float,
    *,
    pool: int = 1,
    mu: float = 0.0,
    tau: float = 0.0,
    ridge: float = 0.0,
    gram: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(W, b)-subproblem: argmin (nu/2)||z - conv(P p, W) - b||^2 + (mu/2)||W||^2 + (tau/2)||W - W_old||^2.

    The conv is a matrix product of the im2col patches of P p with W reshaped to
    [C_out, C_in s^2], and every pixel of every sample is one row of the least-squares
    problem, so this is ``updates.update_Wb`` on [N H W, C_in s^2] rows: b eliminated, p
    centred before the products, normal matrix (C_in s^2)^2, exact. It holds the patch
    matrix, N H W C_in s^2 values, in memory.

    Args:
        p: input of layer l, not pooled, [N, C_in, H_in, W_in].
        z: pre-activation, [N, C_out, H, W] with (H, W) the pooled size.
        W: current weight W_old, [C_out, C_in, s, s].
        nu: weight of the fit term, > 0.
        pool: k of the folded average pooling P (1: none).
        mu: ridge weight, >= 0.
        tau: proximal weight towards W_old, >= 0.
        ridge: relative ridge, >= 0 (``updates.update_Wb``; relative to the patches' variance).
        gram: ``updates.centred_gram(patch_rows(avg_pool(p, pool), s))`` if the caller has it
            (it is constant for the input layer), [C_in s^2, C_in s^2].

    Returns:
        (W, b), shapes [C_out, C_in, s, s] and [C_out].

    Raises:
        ValueError: on mismatched shapes or nu <= 0, mu < 0, tau < 0.

    Example:
        >>> W, b = update_Wb_conv(p, z, conv.weight, nu=1.0, pool=2, tau=1.0)
    """
    s = _check_kernel(W)
    x = avg_pool(p, pool)
    C_out = W.shape[0]
    _check_shape("z", z, (x.shape[0], C_out, *x.shape[2:]))
    rows = patch_rows(x, s)
    W_flat, b = U.update_Wb(
        rows, z.permute(0, 2, 3, 1).reshape(-1, C_out), W.reshape(C_out, -1), nu,
        mu=mu, tau=tau, ridge=ridge, gram=gram,
    )  # fmt: skip
    return W_flat.view_as(W), b


def _fold(q_prev: Tensor, u_prev: Tensor, rho: float, k: int) -> tuple[Tensor, Tensor, float]:
    """v = q_prev - u_prev / rho, its pooled P v, and the pooled problem's penalty k^2 rho."""
    v = torch.add(q_prev, u_prev, alpha=-1 / rho)
    return v, avg_pool(v, k), rho * k * k


def _lift(v: Tensor, x: Tensor, v_bar: Tensor, k: int) -> Tensor:
    """p = v + k^2 P^T (x - P v): the un-pooled p whose pooling is x (see the module docstring)."""
    if k == 1:
        return x
    return v + avg_pool_adjoint(x - v_bar, k, (v.shape[2], v.shape[3])).mul_(k * k)


def conv_p_flops(shape: tuple[int, int, int], C_out: int, s: int) -> tuple[float, float]:
    """Flops per sample of one CG iteration and of the DENSE solve's GEMMs, for a pooled map ``shape``.

    CG: a conv and a transposed conv, 2 H W C_in C_out s^2 each. DENSE: ``updates.update_p``
    on the explicit n_out x n_in matrix (n = C H W): 4 n_out n_in if n_out <= n_in, else
    2 n_in (n_out + n_in). The DENSE set-up (building the matrix, one factorisation) is
    shared by all N samples and not counted.
    """
    C_in, H, W = shape
    n_in, n_out = C_in * H * W, C_out * H * W
    cg = 4.0 * H * W * C_in * C_out * s * s
    dense = 4.0 * n_out * n_in if n_out <= n_in else 2.0 * n_in * (n_out + n_in)
    return cg, dense


def choose_p_solver(
    shape: tuple[int, int, int], C_out: int, s: int, *, cg_iters: float, max_dense: int = 4096
) -> PSolver:
    """DENSE when it costs no more per sample than ``cg_iters`` CG iterations and is small enough.

    Args:
        shape: (C_in, H, W) of the pooled input map.
        C_out: output channels.
        s: kernel size.
        cg_iters: the CG iterations a p-step is expected to take.
        max_dense: largest C H W (input or output) for which the explicit matrix is built.

    Returns:
        ``PSolver.DENSE`` or ``PSolver.CG``.
    """
    cg, dense = conv_p_flops(shape, C_out, s)
    n = max(math.prod(shape), C_out * shape[1] * shape[2])
    return PSolver.DENSE if n <= max_dense and dense <= cg_iters * cg else PSolver.CG


def update_p_conv(
    W: Tensor,
    b: Tensor,
    z: Tensor,
    q_prev: Tensor,
    u_prev: Tensor,
    rho: float,
    nu: float,
    *,
    pool: int = 1,
    p_old: Tensor | None = None,
    solver: PSolver = PSolver.CG,
    tol: float = 1e-3,
    max_iter: int = 50,
) -> ConvPSolve:
    """p-subproblem: argmin (nu/2)||z - conv(P p, W) - b||^2 + <u_prev, p - q_prev> + (rho/2)||p - q_prev||^2.

    Solved on the pooled map (see the module docstring), as the normal equations
    (nu A^T A + k^2 rho I) x = nu A^T (z - b) + k^2 rho P v, by conjugate gradients (each
    sample until its relative residual is <= ``tol``, at most ``max_iter`` iterations,
    warm-started from P p_old) or exactly through the explicit matrix.

    Args:
        W: weight of layer l, [C_out, C_in, s, s].
        b: bias, [C_out].
        z: pre-activation of layer l, [N, C_out, H, W].
        q_prev: output of layer l-1 (not pooled), [N, C_in, H_in, W_in].
        u_prev: dual of the link p_l = q_{l-1}, shape of ``q_prev``.
        rho: penalty of the link, > 0.
        nu: weight of the fit term, > 0.
        pool: k of the folded average pooling (1: none).
        p_old: the current p (warm start for CG; default: the minimiser of the link terms).
        solver: ``PSolver.CG`` or ``PSolver.DENSE``.
        tol: CG's relative residual per sample, >= 0.
        max_iter: CG's iteration cap, >= 1.

    Returns:
        ``ConvPSolve(p, iterations, converged)``; ``converged`` is False when CG hit its cap
        (p is then the last iterate, still a descent from the warm start).

    Raises:
        ValueError: on mismatched shapes, rho, nu <= 0, tol < 0 or max_iter < 1.

    Example:
        >>> sol = update_p_conv(conv.weight, conv.bias, z, q_prev, u_prev, 1.0, 1.0, pool=2)
        >>> p = sol.p
    """
    _check_positive(rho=rho, nu=nu)
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1 (max_iter: {max_iter})")
    _check_kernel(W)
    C_out, C_in = W.shape[:2]
    N, _, H_in, W_in = q_prev.shape
    H, Wd = H_in // pool, W_in // pool
    _check_shape("q_prev", q_prev, (N, C_in, H_in, W_in))
    _check_shape("u_prev", u_prev, tuple(q_prev.shape))
    _check_shape("b", b, (C_out,))
    _check_shape("z", z, (N, C_out, H, Wd))
    v, v_bar, rho_bar = _fold(q_prev, u_prev, rho, pool)
    if PSolver(solver) is PSolver.DENSE:
        A = conv_matrix(W, (C_in, H, Wd))
        x = U.update_p(
            A, b.repeat_interleave(H * Wd), z.flatten(1), v_bar.flatten(1),
            torch.zeros_like(v_bar.flatten(1)), rho_bar, nu,
        ).view_as(v_bar)  # fmt: skip
        return ConvPSolve(_lift(v, x, v_bar, pool), 0, True)
    rhs = torch.add(conv_adjoint(z - b[:, None, None], W), v_bar, alpha=rho_bar / nu).mul_(nu)
    x0 = v_bar if p_old is None else avg_pool(p_old, pool)
    sol = batched_cg(
        lambda d: torch.add(conv_adjoint(conv_forward(d, W), W), d, alpha=rho_bar / nu).mul_(nu),
        rhs,
        x0,
        tol=tol,
        max_iter=max_iter,
    )
    return ConvPSolve(_lift(v, sol.x, v_bar, pool), sol.iterations, sol.converged)


def update_p_flat(
    W: Tensor,
    b: Tensor,
    z: Tensor,
    q_prev: Tensor,
    u_prev: Tensor,
    rho: float,
    nu: float,
    *,
    pool: int = 1,
) -> Tensor:
    """p-subproblem of a dense layer on flatten(P p): ``updates.update_p`` on the pooled problem.

    argmin (nu/2)||z - flatten(P p) W^T - b||^2 + <u_prev, p - q_prev> + (rho/2)||p - q_prev||^2,
    exact, through the pooling fold (flattening is a reordering, so it folds with P = I).

    Args:
        W: weight of the dense layer, [n_out, C H W] with (H, W) the pooled size.
        b: bias, [n_out].
        z: pre-activation, [N, n_out].
        q_prev: output of the previous (conv) layer, not pooled, [N, C, H_in, W_in].
        u_prev: dual of the link, shape of ``q_prev``.
        rho: penalty of the link, > 0.
        nu: weight of the fit term, > 0.
        pool: k of the folded average pooling (1: none).

    Returns:
        The new p, shape of ``q_prev``.

    Raises:
        ValueError: on mismatched shapes or rho, nu <= 0.
    """
    _check_positive(rho=rho, nu=nu)
    _check_shape("u_prev", u_prev, tuple(q_prev.shape))
    v, v_bar, rho_bar = _fold(q_prev, u_prev, rho, pool)
    flat = v_bar.flatten(1)
    x = U.update_p(W, b, z, flat, torch.zeros_like(flat), rho_bar, nu).view_as(v_bar)
    return _lift(v, x, v_bar, pool)
