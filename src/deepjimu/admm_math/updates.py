"""pdADMM subproblem solutions (Problem 2 of the reference) as pure tensor functions.

Layout is samples-first, like ``nn.Linear``: for layer l with n_{l-1} inputs and n_l outputs,

    p [N, n_{l-1}]   W [n_l, n_{l-1}]   b [n_l]   z, q, u [N, n_l]   a = p W^T + b [N, n_l]

q_l is the output of layer l (the copy of p_{l+1}) and u_l the dual of p_{l+1} = q_l.

Every objective term is a SUM over samples (squared Frobenius norms and summed
cross-entropy), exactly as written in the paper. Scaling all terms by 1/N would give the
same minimisers and only rescale u, so the sum keeps rho and nu comparable with the
reference code. The augmented Lagrangian is

    L = CE(z_L; y) + sum_l (nu/2)||z_l - a_l||^2
        + sum_{l<L} [ (nu/2)||q_l - relu(z_l)||^2 + <u_l, p_{l+1} - q_l>
                      + (rho/2)||p_{l+1} - q_l||^2 ].

One iteration per layer: ``update_p`` -> ``update_Wb`` -> ``a = p @ W.T + b``, computed
once and reused by the z-step and the
objective -> ``update_z_hidden`` / ``update_z_last`` -> ``update_q`` -> ``update_u``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "GRAM_CHUNK",
    "KnownInputs",
    "LastLayerSolve",
    "LayerVars",
    "WbStats",
    "add_product",
    "augmented_lagrangian",
    "batch_stats",
    "by_rows",
    "centred_gram",
    "combine_stats",
    "extrapolate",
    "extrapolate_into",
    "fit_term",
    "gram_strips",
    "last_layer_objective",
    "layer_lagrangian",
    "layer_terms",
    "linear",
    "merge_stats",
    "pool_stats",
    "primal_residual",
    "remove_stats",
    "ridge_weight",
    "samples_side",
    "sum_by_rows",
    "update_Wb",
    "update_Wb_stats",
    "update_p",
    "update_q",
    "update_u",
    "update_z_hidden",
    "update_z_last",
]


class LastLayerSolve(NamedTuple):
    """Result of ``update_z_last``."""

    z: Tensor
    iterations: int
    converged: bool


@dataclass
class LayerVars:
    """The pdADMM variables of one layer; q and u are None for the last layer."""

    p: Tensor
    W: Tensor
    b: Tensor
    z: Tensor
    q: Tensor | None = None
    u: Tensor | None = None


def _check_shape(name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)} (got {list(t.shape)})")


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0 ({name}: {value})")


def _check_nonnegative(**values: float) -> None:
    for name, value in values.items():
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0 ({name}: {value})")


def _solve_right_psd(A: Tensor, B: Tensor) -> Tensor:
    """X with X A = B for symmetric PSD A: Cholesky, or the pseudo-inverse if A is singular."""
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) == 0:
        return torch.cholesky_solve(B.T, L).T
    return B @ torch.linalg.pinv(A, hermitian=True)


def _eye(n: int, like: Tensor) -> Tensor:
    return torch.eye(n, dtype=like.dtype, device=like.device)


# rows per partial product of a Gram or cross product; the partials are summed in float64
GRAM_CHUNK = 8192


def _chunked(product: Callable[[Tensor, Tensor], Tensor], a: Tensor, b: Tensor) -> Tensor:
    """``product(a, b)`` (a sum over the rows of a and b) from partials of ``GRAM_CHUNK`` rows.

    A float32 GEMM sums its inner dimension in float32. Over the N H W patch rows of a conv
    layer (2.8 million for 3,600 MNIST images at 28x28) that sum lost 1.3% of the Gram
    matrix and moved the first layer's exact W-step 13% away from a fixed point, every
    iteration; on cnn:16-32 test accuracy fell from 0.974 to 0.476 in 30 iterations
    (BENCHMARKS.md, section 12). torch has no compensated or float64-accumulating float32
    GEMM (and float64 GEMMs are slow on most GPUs), hence this: each partial is a float32
    GEMM over at most GRAM_CHUNK rows, the partials are summed in float64. With at most
    GRAM_CHUNK rows it is one plain product, as before.
    """
    N = a.shape[0]
    if N <= GRAM_CHUNK:
        return product(a, b)
    first = product(a[:GRAM_CHUNK], b[:GRAM_CHUNK])
    total = first.to(torch.float64)
    for lo in range(GRAM_CHUNK, N, GRAM_CHUNK):
        total += product(a[lo : lo + GRAM_CHUNK], b[lo : lo + GRAM_CHUNK])
    return total.to(first.dtype)


def _t_mm(a: Tensor, b: Tensor) -> Tensor:
    """a^T b over many rows (:func:`_chunked`)."""
    return _chunked(lambda x, y: x.T @ y, a, b)


def _gram(p: Tensor, ptp: Tensor | None = None, strips: int = 4) -> Tensor:
    """p^T p (or the caller's ``ptp``), computing only the upper triangle for wide p.

    torch has no SYRK, so the upper triangle is computed as ``strips`` row strips
    (about 5/8 of the GEMM flops for 4 strips) and mirrored: 25-30% faster for n >= 256.
    Summed over the rows in chunks (:func:`_chunked`).
    """
    n = p.shape[1]
    if ptp is not None:
        _check_shape("ptp", ptp, (n, n))
        return ptp
    return _chunked(lambda x, _: _gram_rows(x, strips), p, p)


def gram_strips(n: int, strips: int = 4) -> list[int]:
    """The column edges of the row strips in which :func:`_gram` computes the upper triangle
    of an [n, n] Gram matrix: [0, n] (one product) below 64 columns a strip.

    Example:
        >>> gram_strips(100), gram_strips(256)
        ([0, 100], [0, 64, 128, 192, 256])
    """
    if n < 64 * strips:
        return [0, n]
    return [n * i // strips for i in range(strips + 1)]


def _gram_rows(p: Tensor, strips: int) -> Tensor:
    n = p.shape[1]
    edges = gram_strips(n, strips)
    if len(edges) == 2:
        return p.T @ p
    G = torch.empty(n, n, dtype=p.dtype, device=p.device)
    for lo, hi in itertools.pairwise(edges):
        torch.mm(p[:, lo:hi].T, p[:, lo:], out=G[lo:hi, lo:])
        G[hi:, lo:hi] = G[lo:hi, hi:].T
    return G


def ridge_weight(gram: Tensor, nu: float, ridge: float, n_in: int | None = None) -> Tensor:
    """The ridge weight ``ridge * nu * tr(G) / n`` of a (W, b) step whose centred Gram is ``gram``.

    ``gram`` may be either side, (p - m)^T (p - m) or (p - m)(p - m)^T: both have the trace
    ||p - m||^2; ``n_in`` is the number of inputs n (default: the side of ``gram``).

    Training a linear map on inputs with isotropic noise of variance s^2 added is, in
    expectation, least squares plus (N s^2 / 2)||W||^2 (Bishop, "Training with noise is
    equivalent to Tikhonov regularization", 1995). With s^2 = ``ridge`` times the layer's
    mean input variance, tr(G) / N / n, the weight is ``ridge * nu * tr(G) / n``: scale-free,
    so one ``ridge`` means the same for the raw pixels and for a hidden layer whose
    activations are a hundred times smaller, and it does not grow or shrink with N.
    It is a tensor, so no host sync.
    """
    if n_in is None:
        return torch.diagonal(gram).mean() * (ridge * nu)
    return torch.diagonal(gram).sum() * (ridge * nu / n_in)


def samples_side(n_samples: int, n_in: int) -> bool:
    """Whether ``update_Wb`` factorises the N x N kernel matrix (N <= n_in) rather than the
    n_in x n_in Gram matrix: the smaller side, as ``update_p`` does."""
    return n_samples <= n_in


def centred_gram(p: Tensor) -> Tensor:
    """The matrix that ``update_Wb`` factorises, m the mean row of p [N, n]: the Gram matrix
    (p - m)^T (p - m) [n, n], or with N <= n the kernel matrix (p - m)(p - m)^T [N, N]."""
    pc = p - p.mean(dim=0)
    return _gram(pc.T) if samples_side(*p.shape) else _gram(pc)


def update_p(
    W: Tensor, b: Tensor, z: Tensor, q_prev: Tensor, u_prev: Tensor, rho: float, nu: float
) -> Tensor:
    """p-subproblem: argmin (nu/2)||z-pW^T-b||^2 + <u_prev, p - q_prev> + (rho/2)||p - q_prev||^2.

    The objective is quadratic with Hessian H = nu W^T W + rho I, so the exact minimiser is
    one linear solve; it does not depend on the current p. With v = q_prev - u_prev / rho
    (the minimiser of the link terms alone) it reads p = v + (z - b - v W^T) M with
    M = nu W H^-1 = nu (nu W W^T + rho I)^-1 W, so only the smaller of the two matrices is
    factorised and applying it costs 4 N n_l n_{l-1} flops (a layer that narrows, like the
    output layer, never pays N n_{l-1}^2). A widening layer (n_l > n_{l-1}) uses
    p = (nu (z - b) W + rho v) H^-1 instead, 2 N n_{l-1} (n_l + n_{l-1}) flops. For the
    quantized variant (pdADMM-G-Q), project the result with ``quantize.project``.

    Args:
        W: weight of layer l, [n_l, n_{l-1}].
        b: bias of layer l, [n_l].
        z: pre-activation of layer l, [N, n_l].
        q_prev: output of layer l-1 (left neighbour), [N, n_{l-1}].
        u_prev: dual of the link p_l = q_{l-1}, [N, n_{l-1}].
        rho: penalty of the link, > 0.
        nu: weight of the layer-fit terms, > 0.

    Returns:
        The new p_l, [N, n_{l-1}].

    Raises:
        ValueError: on mismatched shapes or rho, nu <= 0.

    Example:
        >>> p = update_p(layer.weight, layer.bias, z, q_prev, u_prev, rho=1.0, nu=1.0)
    """
    _check_positive(rho=rho, nu=nu)
    n_out, n_in = W.shape
    N = z.shape[0]
    _check_shape("b", b, (n_out,))
    _check_shape("z", z, (N, n_out))
    _check_shape("q_prev", q_prev, (N, n_in))
    _check_shape("u_prev", u_prev, (N, n_in))
    v = torch.add(q_prev, u_prev, alpha=-1 / rho)
    if n_out <= n_in:
        K = nu * (W @ W.T) + rho * _eye(n_out, W)
        M = torch.cholesky_solve(W, torch.linalg.cholesky(K)).mul_(nu)
        # p = v + s M with s = z - b - v W^T, as v - r M with r = v W^T + b - z
        r = linear(v, W, b).sub_(z)
        return add_product(v, r, M, alpha=-1.0)
    H = nu * (W.T @ W) + rho * _eye(n_in, W)
    # H >= rho I is well conditioned, so its explicit inverse is safe, and applying it is one
    # GEMM with N rows: several times faster than a triangular solve on CPUs and GPUs alike.
    H_inv = torch.cholesky_solve(_eye(n_in, W), torch.linalg.cholesky(H))
    rhs = add_product(torch.mul(v, rho), z - b, W, alpha=nu)
    return (rhs @ H_inv).to(v.dtype)


def _low_precision(t: Tensor) -> bool:
    return torch.is_autocast_enabled(t.device.type)


def linear(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """x W^T + b, [N, n_out], as ``nn.Linear`` computes it: b added inside the GEMM (one
    allocation and one pass over memory fewer). Under autocast b is added outside the
    product, so that only the product drops to bf16 and the sum keeps b's dtype."""
    if _low_precision(x):
        return x @ W.T + b
    return torch.addmm(b, x, W.T)


def add_product(c: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """c + alpha a b, written into c (a fresh temporary of the caller's).

    The GEMM adds the product into c itself (beta = 1): no product is allocated, and no
    separate pass over memory adds it. Under autocast the product is formed in bf16 and added
    to c outside the matmul, so c keeps its full-precision dtype.
    """
    if _low_precision(c):
        return c.add_(a @ b, alpha=alpha)
    return c.addmm_(a, b, alpha=alpha)


def update_Wb(
    p: Tensor,
    z: Tensor,
    W: Tensor,
    nu: float,
    *,
    mu: float = 0.0,
    tau: float = 0.0,
    ridge: float = 0.0,
    gram: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(W, b)-subproblem: argmin (nu/2)||z - pW^T - b||^2 + (mu/2)||W||^2 + (tau/2)||W - W_old||^2.

    Eliminating b (= mean of z - p W^T) leaves the same problem on centred p and z, so
    the joint minimiser costs the same as the W-subproblem alone. b is not regularised.
    p is centred before the products, not the products afterwards (p^T p -
    N m m^T): ReLU outputs have a large mean, and subtracting it from a rounded p^T p
    cancels most of the significant bits: under bf16 autocast that cancellation made the
    iteration diverge on digits (test accuracy 0.35 after 30 iterations against 0.98).

    The normal equations W (nu G + d I) = nu z_c^T p_c + tau W_old (G = p_c^T p_c,
    d = mu + tau + the relative ridge) are solved on the smaller side
    (:func:`samples_side`): with more samples than inputs through G [n_{l-1}, n_{l-1}]; with
    N <= n_{l-1} (Cora's 140 training nodes and 7,165 inputs) through the kernel matrix
    K = nu p_c p_c^T + d I [N, N], by the push-through identity p_c^T (nu p_c p_c^T + d I)^-1
    = (nu G + d I)^-1 p_c^T: W = R p_c + (tau / d) W_old with R K = nu (z_c - (tau / d)
    p_c W_old^T)^T. Both are the same minimiser (at d = 0 the same minimum-norm one); the
    kernel side costs N^2 n_{l-1} instead of N n_{l-1}^2 + n_{l-1}^3 / 3.

    Args:
        p: input of layer l, [N, n_{l-1}].
        z: pre-activation, [N, n_l].
        W: current weight W_old (used only when tau > 0), [n_l, n_{l-1}].
        nu: weight of the fit term, > 0.
        mu: ridge weight on W, >= 0.
        tau: proximal weight towards W_old, >= 0.
        ridge: relative ridge, >= 0: adds :func:`ridge_weight` of the Gram to ``mu`` (the
            ridge of input noise with ``ridge`` times the inputs' mean variance).
        gram: ``centred_gram(p)`` if the caller has it (it is constant for the input layer):
            [n_{l-1}, n_{l-1}], or [N, N] when N <= n_{l-1}.

    Returns:
        (W, b), shapes [n_l, n_{l-1}] and [n_l].

    Raises:
        ValueError: on mismatched shapes or nu <= 0, mu < 0, tau < 0, ridge < 0.

    Example:
        >>> W, b = update_Wb(p, z, layer.weight, nu=1.0)
        >>> a = p @ W.T + b
    """
    _check_positive(nu=nu)
    _check_nonnegative(mu=mu, tau=tau, ridge=ridge)
    N, n_in = p.shape
    n_out = W.shape[0]
    _check_shape("W", W, (n_out, n_in))
    _check_shape("z", z, (N, n_out))
    p_mean = p.mean(dim=0)
    p_centred = p - p_mean
    if samples_side(N, n_in):
        W_new = _Wb_kernel(p_centred, z, W, nu, mu, tau, ridge, gram)
    else:
        G_centred = _gram(p_centred, gram)
        zc_t_p = _t_mm(z, p_centred)  # = (z - mean z)^T (p - m): the columns of p - m sum to 0
        eye = torch.eye(n_in, dtype=p.dtype, device=p.device)
        damping = ridge_weight(G_centred, nu, ridge) + (mu + tau)
        W_new = _solve_right_psd(nu * G_centred + damping * eye, nu * zc_t_p + tau * W)
    # b = mean z - W m cancels as much as the Gram would: elementwise, so it stays float32
    return W_new, z.mean(dim=0) - (W_new * p_mean).sum(dim=1)


def _Wb_kernel(
    p_centred: Tensor,
    z: Tensor,
    W: Tensor,
    nu: float,
    mu: float,
    tau: float,
    ridge: float,
    gram: Tensor | None,
) -> Tensor:
    """W of :func:`update_Wb` through the N x N kernel matrix (N <= n_{l-1}; see there)."""
    N, n_in = p_centred.shape
    if gram is None:
        kernel = _gram(p_centred.T)
    else:
        _check_shape("gram", gram, (N, N))
        kernel = gram
    damping = ridge_weight(kernel, nu, ridge, n_in) + (mu + tau)
    # z is centred too: with d > 0 its mean would cancel only through 1^T p_c = 0 after a
    # division by d, which rounding does not do for a small d
    rhs = z - z.mean(dim=0)
    if tau > 0:  # then d >= tau > 0
        rhs = torch.sub(rhs, p_centred @ W.T * (tau / damping))
    K = nu * kernel + damping * _eye(N, kernel)
    if ridge == 0 and mu + tau == 0:
        # K = nu p_c p_c^T is singular (its rows sum to 0): the minimum-norm solution,
        # straight away, as a Cholesky of a rounded singular matrix may succeed
        R = (nu * rhs.T) @ torch.linalg.pinv(K, hermitian=True)
    else:
        R = _solve_right_psd(K, nu * rhs.T)
    W_new = R.to(p_centred.dtype) @ p_centred
    return W_new + W * (tau / damping) if tau > 0 else W_new


@dataclass(frozen=True)
class WbStats:
    """Weighted, centred sufficient statistics of the (W, b) problem over several batches.

    For samples i with weights w_i (older batches decayed): ``n`` = sum w_i, ``p_mean`` and
    ``z_mean`` the weighted means, ``C_pp`` = sum w_i (p_i - p_mean)(p_i - p_mean)^T and
    ``C_zp`` = sum w_i (z_i - z_mean)(p_i - p_mean)^T. They hold everything the exact (W, b)
    step over those samples needs, in O(n_{l-1}^2) memory whatever their number.
    """

    n: float
    p_mean: Tensor
    z_mean: Tensor
    C_pp: Tensor
    C_zp: Tensor


def batch_stats(p: Tensor, z: Tensor) -> WbStats:
    """The statistics of one batch (p, z), every sample at weight 1.

    Args:
        p: the batch's layer inputs, [B, n_{l-1}].
        z: the batch's pre-activations, [B, n_l].

    Raises:
        ValueError: on mismatched shapes.
    """
    B = p.shape[0]
    _check_shape("z", z, (B, z.shape[1]))
    p_mean, z_mean = p.mean(dim=0), z.mean(dim=0)
    pc, zc = p - p_mean, z - z_mean
    return WbStats(float(B), p_mean, z_mean, _gram(pc), _t_mm(zc, pc))


def merge_stats(old: WbStats | None, new: WbStats, decay: float = 1.0) -> WbStats:
    """``old`` with every weight multiplied by ``decay``, plus ``new``: the statistics of both.

    Chan et al.'s pairwise update of centred moments: each part is centred on its own mean
    and the means' difference enters as one rank-one term, so no large mean is subtracted
    from a large scatter (the cancellation ``update_Wb`` avoids too).

    Raises:
        ValueError: on ``decay`` outside [0, 1] or statistics of different layers.
    """
    if not 0 <= decay <= 1:
        raise ValueError(f"decay must be in [0, 1] (decay: {decay})")
    if old is None or decay == 0 or old.n == 0:
        return new
    _check_shape("C_zp", new.C_zp, tuple(old.C_zp.shape))
    n_old = old.n * decay
    n = n_old + new.n
    dp, dz = new.p_mean - old.p_mean, new.z_mean - old.z_mean
    f = n_old * new.n / n
    return WbStats(
        n,
        old.p_mean + dp * (new.n / n),
        old.z_mean + dz * (new.n / n),
        old.C_pp * decay + new.C_pp + f * torch.outer(dp, dp),
        old.C_zp * decay + new.C_zp + f * torch.outer(dz, dp),
    )


def remove_stats(total: WbStats, part: WbStats) -> WbStats | None:
    """The statistics of ``total``'s samples without ``part``'s (the inverse of :func:`merge_stats`).

    Returns:
        None when nothing is left.

    Raises:
        ValueError: when ``part`` holds more samples than ``total``, or of another layer.
    """
    _check_shape("C_zp", part.C_zp, tuple(total.C_zp.shape))
    n = total.n - part.n
    if n < -0.5:
        raise ValueError(f"cannot remove {part.n:g} samples from {total.n:g}")
    if n < 0.5:
        return None
    p_mean = (total.p_mean * total.n - part.p_mean * part.n) / n
    z_mean = (total.z_mean * total.n - part.z_mean * part.n) / n
    dp, dz = part.p_mean - p_mean, part.z_mean - z_mean
    f = n * part.n / total.n
    return WbStats(
        n,
        p_mean,
        z_mean,
        total.C_pp - part.C_pp - f * torch.outer(dp, dp),
        total.C_zp - part.C_zp - f * torch.outer(dz, dp),
    )


@dataclass(frozen=True)
class KnownInputs:
    """A part's rows (p, z) of a (W, b) problem whose inputs' pooled statistics are known
    already (``inputs``: their ``n``, ``p_mean`` and ``C_pp``; e.g. of the data, which do
    not change): :func:`pool_stats` pools only z's mean and C_zp."""

    p: Tensor
    z: Tensor
    inputs: WbStats


def pool_stats(
    parts: Sequence[WbStats | KnownInputs], total: Callable[[Tensor], Tensor]
) -> list[WbStats]:
    """The statistics of every part's samples, for each of several (W, b) problems (one a
    layer), from this part's, ``total`` summing a tensor over the parts in place (an
    all-reduce among the replicas of a layer block): two sums in all, however many problems.

    Each part's centred moments are moved to the pooled means (Chan et al.'s rank-one term,
    as in :func:`merge_stats`) and then summed: the weighted means first, then the moments.
    So each pooled (W, b) step is the one over all the parts' samples, up to the order of
    sums.
    """
    heads = [
        part.z.sum(dim=0)
        if isinstance(part, KnownInputs)
        else torch.cat(
            [part.p_mean * part.n, part.z_mean * part.n, part.p_mean.new_tensor([part.n])]
        )
        for part in parts
    ]
    summed = total(torch.cat(heads)).split([len(h) for h in heads])
    moments: list[list[Tensor]] = []
    means: list[tuple[float, Tensor, Tensor]] = []
    for part, head in zip(parts, summed, strict=True):
        if isinstance(part, KnownInputs):
            n, p_mean = part.inputs.n, part.inputs.p_mean
            z_mean = head / n
            moments.append([_t_mm(part.z - z_mean, part.p - p_mean)])
        else:
            n_in = part.p_mean.shape[0]
            n = float(head[-1])
            p_mean, z_mean = head[:n_in] / n, head[n_in:-1] / n
            dp, dz = part.p_mean - p_mean, part.z_mean - z_mean
            moments.append(
                [part.C_pp + part.n * torch.outer(dp, dp), part.C_zp + part.n * torch.outer(dz, dp)]
            )
        means.append((n, p_mean, z_mean))
    flat = [m for ms in moments for m in ms]
    pooled = iter(
        t.view_as(m)
        for t, m in zip(
            total(torch.cat([m.flatten() for m in flat])).split([m.numel() for m in flat]),
            flat,
            strict=True,
        )
    )
    out = []
    for part, (n, p_mean, z_mean) in zip(parts, means, strict=True):
        C_pp = part.inputs.C_pp if isinstance(part, KnownInputs) else next(pooled)
        out.append(WbStats(n, p_mean, z_mean, C_pp, next(pooled)))
    return out


def combine_stats(old: WbStats | None, p: Tensor, z: Tensor, decay: float) -> WbStats:
    """``old`` with every weight multiplied by ``decay``, plus the batch (p, z) at weight 1.

    Args:
        old: the statistics so far, or None for the first batch.
        p: the batch's layer inputs, [B, n_{l-1}].
        z: the batch's pre-activations, [B, n_l].
        decay: weight factor of the old samples, in [0, 1].

    Returns:
        the combined statistics (:func:`merge_stats`).

    Raises:
        ValueError: on mismatched shapes or ``decay`` outside [0, 1].
    """
    if old is not None:
        _check_shape("p", p, (p.shape[0], old.p_mean.shape[0]))
    return merge_stats(old, batch_stats(p, z), decay)


def update_Wb_stats(
    stats: WbStats, W: Tensor, nu: float, *, tau: float = 0.0, ridge: float = 0.0
) -> tuple[Tensor, Tensor]:
    """(W, b)-subproblem over the samples that ``stats`` summarises, each with its weight:

    argmin sum_i w_i (nu/2)||z_i - W p_i - b||^2 + (mu/2)||W||^2 + (tau/2)||W - W_old||^2,
    mu = ``ridge_weight(C_pp, nu, ridge)``, solved exactly as in ``update_Wb``:
    W (nu C_pp + (mu + tau) I) = nu C_zp + tau W_old, b = z_mean - W p_mean.

    Args:
        stats: from ``combine_stats``.
        W: current weight W_old, [n_l, n_{l-1}].
        nu: weight of the fit term, > 0.
        tau: proximal weight towards W_old, >= 0.
        ridge: relative ridge, >= 0 (as in ``update_Wb``).

    Returns:
        (W, b), shapes [n_l, n_{l-1}] and [n_l].

    Raises:
        ValueError: on mismatched shapes or nu <= 0, tau < 0, ridge < 0.
    """
    _check_positive(nu=nu)
    _check_nonnegative(tau=tau, ridge=ridge)
    n_out, n_in = W.shape
    _check_shape("C_zp", stats.C_zp, (n_out, n_in))
    eye = torch.eye(n_in, dtype=W.dtype, device=W.device)
    damping = ridge_weight(stats.C_pp, nu, ridge) + tau
    W_new = _solve_right_psd(nu * stats.C_pp + damping * eye, nu * stats.C_zp + tau * W)
    return W_new, stats.z_mean - (W_new * stats.p_mean).sum(dim=1)


def extrapolate(x: Tensor, x_prev: Tensor, beta: float) -> Tensor:
    """Momentum (heavy-ball / Nesterov-type extrapolation) of an iterate: x + beta (x - x_prev).

    At a fixed point of the iteration x = x_prev, so the extrapolated iteration has the
    same fixed points as the plain one.
    """
    return torch.add(x, torch.sub(x, x_prev), alpha=beta)


def extrapolate_into(x: Tensor, x_prev: Tensor, beta: float) -> Tensor:
    """:func:`extrapolate` written over ``x_prev``, which it returns: the same operations, so
    bit for bit the same values, without allocating (two passes over memory where a copy
    of x, then x - x_prev and the sum, each into new memory, took nine, and fresh memory
    costs page faults: 43-60 ms against 2.6 ms an iteration for mlp:256x3 and 3,600
    rows on the 2-core VM). ``x_prev`` must belong to the caller alone.
    """
    return torch.add(x, torch.sub(x, x_prev, out=x_prev), alpha=beta, out=x_prev)


def update_z_hidden(a: Tensor, q: Tensor, z_old: Tensor) -> Tensor:
    """z-subproblem (l < L): argmin_z (nu/2)(||z - a||^2 + ||q - relu(z)||^2 + ||z - z_old||^2).

    Elementwise and exact. On z <= 0 the objective is (z - a)^2 + q^2 + (z - z_old)^2,
    minimised by z1 = min((a + z_old)/2, 0); on z >= 0 it is (z - a)^2 + (q - z)^2 +
    (z - z_old)^2, minimised by z2 = max((a + q + z_old)/3, 0). The global minimiser is
    the better of the two. With s = a + z_old the objectives are f1 = c - 2 z1^2 and
    f2 = c - 3 z2^2 (c = a^2 + q^2 + z_old^2), so z2 wins iff 3 z2^2 > 2 z1^2, that is
    sqrt(3/2) z2 + z1 > 0 (z1 <= 0 <= z2): a few passes over memory instead of twenty.
    nu multiplies every term, so it does not appear.

    Args:
        a: p W^T + b, [N, n_l].
        q: output of layer l, [N, n_l].
        z_old: current z, [N, n_l].

    Returns:
        The new z, [N, n_l].

    Raises:
        ValueError: on mismatched shapes.
    """
    _check_shape("q", q, tuple(a.shape))
    _check_shape("z_old", z_old, tuple(a.shape))
    return by_rows(_z_hidden, a, q, z_old)


def _z_hidden(a: Tensor, q: Tensor, z_old: Tensor) -> Tensor:
    s = a + z_old
    z2 = torch.add(s, q).clamp_(min=0).div_(3)
    z1 = s.clamp_(max=0).div_(2)
    take2 = torch.add(z1, z2, alpha=math.sqrt(1.5)).gt_(0)
    # z2 * take2 + z1 * (1 - take2), in place: exact, as one of the two products is zero.
    return z2.mul_(take2).sub_(z1.mul_(take2.sub_(1)))


# elements of a row block of ``by_rows``, per thread: a block's temporaries (a few of them,
# 4 bytes an element) stay in a core's L2 cache, and each elementwise operation on it still
# splits over the threads (torch splits from 32,768 elements a thread, at::internal::GRAIN_SIZE)
_BLOCK_ELEMENTS = 32_768


def by_rows(fn: Callable[..., Tensor], *ts: Tensor) -> Tensor:
    """``fn(*ts)`` computed on blocks of rows, for an ``fn`` that works row by row.

    torch runs each elementwise operation over the whole tensor before the next: a chain of
    ten of them over [N, n] float32 tensors reads and writes memory ten times (no fusion
    without a compiler). On blocks whose temporaries stay in cache it reads its inputs
    once: ``update_z_hidden`` on [10,000, 500] went from 42 ms to 18 ms on one CPU core.

    Args:
        fn: a function of tensors with the same number of rows, returning one of them.
        ts: its arguments, [N, ...] each.

    Returns:
        ``fn(*ts)``, [N, ...], the same values (the work of a row depends on that row alone);
        on a GPU in one piece (there the blocks' many small kernels took an iteration of 10 x
        1000, N = 55,000, from 0.148 to 0.22 s on an H200).
    """
    block = _row_block(ts[0])
    if block is None:
        return fn(*ts)
    out = torch.empty_like(ts[0])
    for lo in range(0, ts[0].shape[0], block):
        out[lo : lo + block] = fn(*(t[lo : lo + block] for t in ts))
    return out


def sum_by_rows(fn: Callable[..., Tensor], *ts: Tensor) -> Tensor:
    """The sum of ``fn`` over blocks of rows of ``ts``, for an ``fn`` that sums over rows
    (norms, inner products): the blocks of :func:`by_rows`, whose temporaries stay in cache
    and are small enough to be reused by the memory allocator. Whole temporaries of a few
    MB each come fresh from the operating system on every call and were page-faulted in:
    ``LayerBlock.objective_and_residual`` of mlp:256x3 on 3,600 rows took 38.8 ms with whole
    temporaries, 23.8 ms by blocks (same process, alternating). The partial sums are added
    in float64.
    """
    block = _row_block(ts[0])
    if block is None:
        return fn(*ts)
    first = fn(*(t[:block] for t in ts))
    total = first.to(torch.float64)
    for lo in range(block, ts[0].shape[0], block):
        total += fn(*(t[lo : lo + block] for t in ts))
    return total.to(first.dtype)


def _row_block(t: Tensor) -> int | None:
    """The rows of a block of :func:`by_rows` on ``t``; None for one piece (on a GPU, whose
    kernels are few and large or launch-bound, or when one block holds every row)."""
    if t.device.type != "cpu":
        return None
    block = max(1, _BLOCK_ELEMENTS * torch.get_num_threads() // max(1, t[:1].numel()))
    return None if t.shape[0] <= block else block


def _last_layer_rows(z: Tensor, y: Tensor, center: Tensor, c: float) -> Tensor:
    # Shifting by z_y before logsumexp keeps the rounding error far below the decrease
    # that the line search must detect near the solution.
    ce = torch.logsumexp(z - z.gather(1, y[:, None]), dim=1)
    return ce + (c / 2) * (z - center).square().sum(dim=1)


def update_z_last(
    a: Tensor,
    y: Tensor,
    z_old: Tensor,
    nu: float,
    *,
    prox: bool = False,
    tol: float | None = None,
    max_iter: int = 50,
) -> LastLayerSolve:
    """z-subproblem (l = L): argmin_z CE(z; y) + (nu/2)||z - a||^2 [+ (nu/2)||z - z_old||^2].

    Without ``prox`` this is the reference's last-layer step; ``prox=True`` adds the same
    proximal term as the hidden layers. The objective is strongly convex (modulus nu, or
    2 nu with prox) and smooth (the cross-entropy Hessian diag(s) - s s^T has eigenvalues
    <= 1/2), so Newton's method with a per-sample backtracking (Armijo) line search
    converges globally and quadratically near the solution, even for nu = 1e-4 where
    gradient methods would need thousands of steps. Each Newton step costs O(N C): the
    per-sample Hessian is diagonal plus rank one (Sherman-Morrison). Starts from z_old.

    Args:
        a: p W^T + b of the last layer, [N, C].
        y: integer class labels, [N].
        z_old: current z (warm start, and the proximal centre if ``prox``), [N, C].
        nu: weight of the fit term, > 0.
        prox: include (nu/2)||z - z_old||^2.
        tol: stop when every entry of the gradient is <= tol in absolute value; default
            64 eps of the dtype (7.6e-6 for float32), just above the rounding floor.
        max_iter: cap on Newton steps.

    Returns:
        ``LastLayerSolve(z, iterations, converged)``; converged is False if the cap was hit.

    Raises:
        ValueError: on mismatched shapes, nu <= 0 or max_iter < 1.

    Example:
        >>> z, iterations, converged = update_z_last(a, y, z, nu=1.0)
    """
    _check_positive(nu=nu)
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1 (max_iter: {max_iter})")
    N, C = a.shape
    _check_shape("y", y, (N,))
    _check_shape("z_old", z_old, (N, C))
    if tol is None:
        tol = 64 * torch.finfo(a.dtype).eps
    c = 2 * nu if prox else nu
    center = (a + z_old) / 2 if prox else a
    y_onehot = F.one_hot(y.long(), C).to(a.dtype)
    y_index = y.long()
    z = z_old.clone()
    for iteration in range(max_iter + 1):
        s = torch.softmax(z, dim=1)
        grad = s - y_onehot + c * (z - center)
        if float(grad.abs().max()) <= tol:
            return LastLayerSolve(z, iteration, True)
        if iteration == max_iter:
            break
        d_inv = 1 / (s + c)
        den = (s * c * d_inv).sum(dim=1, keepdim=True)
        step = d_inv * grad + d_inv * s * (s * d_inv * grad).sum(dim=1, keepdim=True) / den
        direction = -step
        slope = (grad * direction).sum(dim=1)
        f0 = _last_layer_rows(z, y_index, center, c)
        # Near the solution the decrease falls below the rounding error of f (about eps
        # times |f| + max |z_j - z_y|): allow that much, or the search would stall there.
        spread = (z - z.gather(1, y_index[:, None])).abs().amax(dim=1)
        f_max = f0 + 8 * torch.finfo(z.dtype).eps * (f0.abs() + spread)
        t = torch.ones(N, 1, dtype=z.dtype, device=z.device)
        accepted = torch.zeros(N, dtype=torch.bool, device=z.device)
        for _ in range(30):
            f_new = _last_layer_rows(z + t * direction, y_index, center, c)
            ok = f_new <= f_max + 0.25 * t.squeeze(1) * slope
            accepted |= ok
            if bool(accepted.all()):
                break
            t = torch.where(accepted[:, None], t, t / 2)
        z = z + torch.where(accepted[:, None], t, torch.zeros_like(t)) * direction
    return LastLayerSolve(z, max_iter, False)


def update_q(p_next: Tensor, u: Tensor, z: Tensor, rho: float, nu: float) -> Tensor:
    """q-subproblem: argmin_q (nu/2)||q - relu(z)||^2 + <u, p_next - q> + (rho/2)||p_next - q||^2.

    Setting the gradient nu (q - relu(z)) - u - rho (p_next - q) to zero gives
    q = (rho p_next + u + nu relu(z)) / (rho + nu).

    Args:
        p_next: input of layer l+1 (right neighbour), [N, n_l].
        u: dual of the link p_{l+1} = q_l, [N, n_l].
        z: pre-activation of layer l, [N, n_l].
        rho: penalty of the link, > 0.
        nu: weight of the activation term, > 0.

    Returns:
        The new q_l, [N, n_l].

    Raises:
        ValueError: on mismatched shapes or rho, nu <= 0.
    """
    _check_positive(rho=rho, nu=nu)
    _check_shape("u", u, tuple(p_next.shape))
    _check_shape("z", z, tuple(p_next.shape))
    return torch.relu(z).mul_(nu).add_(p_next, alpha=rho).add_(u).div_(rho + nu)


def update_u(u: Tensor, p_next: Tensor, q: Tensor, rho: float) -> Tensor:
    """Dual ascent on the link p_{l+1} = q_l: u + rho (p_next - q).

    Args:
        u: current dual, [N, n_l].
        p_next: input of layer l+1, [N, n_l].
        q: output of layer l, [N, n_l].
        rho: penalty of the link, > 0.

    Returns:
        The new u_l, [N, n_l].

    Raises:
        ValueError: on mismatched shapes or rho <= 0.
    """
    _check_positive(rho=rho)
    _check_shape("p_next", p_next, tuple(u.shape))
    _check_shape("q", q, tuple(u.shape))
    return torch.sub(p_next, q).mul_(rho).add_(u)


def layer_lagrangian(
    a: Tensor, z: Tensor, q: Tensor, u: Tensor, p_next: Tensor, rho: float, nu: float
) -> Tensor:
    """The augmented-Lagrangian terms owned by a hidden layer l < L.

    (nu/2)||z - a||^2 + (nu/2)||q - relu(z)||^2 + <u, p_next - q> + (rho/2)||p_next - q||^2.

    Args:
        a: p W^T + b, [N, n_l].
        z: pre-activation, [N, n_l].
        q: output, [N, n_l].
        u: dual of the link to layer l+1, [N, n_l].
        p_next: input of layer l+1, [N, n_l].
        rho: penalty of the link.
        nu: weight of the fit terms.

    Returns:
        A scalar tensor.
    """
    return layer_terms(fit_term(a, z), z, q, u, p_next, rho, nu)[0]


def layer_terms(
    fit: Tensor, z: Tensor, q: Tensor, u: Tensor, p_next: Tensor, rho: float, nu: float
) -> tuple[Tensor, Tensor]:
    """:func:`layer_lagrangian` from the layer's ``fit`` ||z - a||^2 (:func:`fit_term`, which
    a caller that holds a = p W^T + b computes as it goes), and the squared residual
    ||p_next - q||^2 of the layer's link, from one difference p_next - q.

    Summed over blocks of rows (:func:`sum_by_rows`), each squared norm one BLAS dot of a
    difference with itself: no squared copy, three temporaries instead of eight. In float32
    within 1e-6 of the float64 sums (tested).
    """
    act, inner, rr = sum_by_rows(_link_sums, z, q, u, p_next).unbind()
    return (nu / 2) * (fit + act) + inner + (rho / 2) * rr, rr


def fit_term(a: Tensor, z: Tensor) -> Tensor:
    """||z - a||^2 of a layer (a = p W^T + b), summed over blocks of rows (:func:`sum_by_rows`)."""
    return sum_by_rows(lambda a, z: _dot(z - a), a, z)


def _link_sums(z: Tensor, q: Tensor, u: Tensor, p_next: Tensor) -> Tensor:
    """||q - relu(z)||^2, <u, p_next - q> and ||p_next - q||^2 of these rows."""
    r = p_next - q
    e = torch.relu(z).sub_(q)  # (q - relu(z))^2, signed the other way
    return torch.stack([_dot(e), _dot(u, r), _dot(r)])


def _dot(t: Tensor, other: Tensor | None = None) -> Tensor:
    """<t, other> (default ||t||^2) as one BLAS dot: no product is materialised."""
    flat = t.reshape(-1)
    return torch.dot(flat, flat if other is None else other.reshape(-1))


def last_layer_objective(a: Tensor, z: Tensor, y: Tensor, nu: float) -> Tensor:
    """The augmented-Lagrangian terms owned by the last layer: CE(z; y) + (nu/2)||z - a||^2.

    Args:
        a: p W^T + b, [N, C].
        z: logits, [N, C].
        y: integer labels, [N].
        nu: weight of the fit term.

    Returns:
        A scalar tensor (cross-entropy summed over samples).
    """
    return F.cross_entropy(z, y.long(), reduction="sum") + (nu / 2) * (z - a).square().sum()


def augmented_lagrangian(layers: Sequence[LayerVars], y: Tensor, rho: float, nu: float) -> Tensor:
    """The full augmented Lagrangian of Problem 2 (see the module docstring).

    Args:
        layers: the L layers in order; layers[l].q and .u must be set for l < L - 1.
        y: integer labels, [N].
        rho: penalty of the links.
        nu: weight of the fit terms.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: if layers is empty or a hidden layer lacks q or u.
    """
    if not layers:
        raise ValueError("layers must not be empty (layers: 0)")
    total = last_layer_objective(layers[-1].p @ layers[-1].W.T + layers[-1].b, layers[-1].z, y, nu)
    for i, (layer, right) in enumerate(itertools.pairwise(layers)):
        if layer.q is None or layer.u is None:
            raise ValueError(f"hidden layer {i} needs q and u (layers: {len(layers)})")
        a = layer.p @ layer.W.T + layer.b
        total = total + layer_lagrangian(a, layer.z, layer.q, layer.u, right.p, rho, nu)
    return total


def primal_residual(layers: Sequence[LayerVars]) -> Tensor:
    """The primal residual sqrt(sum_{l<L} ||p_{l+1} - q_l||^2) of the constraints p_{l+1} = q_l.

    Args:
        layers: the L layers in order; layers[l].q must be set for l < L - 1.

    Returns:
        A scalar tensor (0 for a single layer).

    Raises:
        ValueError: if a hidden layer lacks q.
    """
    total = torch.zeros((), dtype=layers[0].p.dtype, device=layers[0].p.device)
    for i, (layer, right) in enumerate(itertools.pairwise(layers)):
        if layer.q is None:
            raise ValueError(f"hidden layer {i} needs q (layers: {len(layers)})")
        total = total + (right.p - layer.q).square().sum()
    return total.sqrt()
