"""The floating-point operations of one full-batch pdADMM iteration of dense layers, counted analytically.

One :func:`deepjimu.strategies.admm.driver.serial_iteration` of an MLP block runs, per
layer l (n_in -> n_out inputs and outputs, N samples), what ``updates.py`` computes:

- the p-step (l > 0), on the smaller side: with n_out <= n_in the products W W^T, v W^T and
  r M (r = v W^T + b - z) and the Cholesky factor of K = nu W W^T + rho I [n_out, n_out]
  solved against W;
  else W^T W, (z - b) W, the factor of H [n_in, n_in], H^-1 from it (n_in right-hand
  sides) and rhs H^-1;
- the (W, b)-step, on the smaller side (``updates.samples_side``): with N > n_in the Gram
  p^T p (its upper triangle in 4 row strips when n_in >= 256; kept between iterations for
  layer 0, the data), z^T p, the factor of nu G + d I and its solve for W; with
  N <= n_in the kernel p p^T [N, N], p W_old^T, the kernel's factor and solve, R p;
- a = p W^T + b.

Counted: matmuls (2 m k n), Cholesky factorisations (n^3 / 3) and triangular solve pairs
against a factor (2 n^2 per right-hand side). Not counted: elementwise work (z, q, u, the
centring, the last layer's Newton steps: O(N n) each, bound by memory, not arithmetic),
and the pseudo-inverse fallback of a singular matrix (not taken with tau > 0, the
strategy's setting).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from deepjimu.admm_math.updates import gram_strips, samples_side

__all__ = ["FlopCount", "iteration_flops"]


@dataclass(frozen=True)
class FlopCount:
    """One counted operation of an iteration: what, of which layer, which kind, how many FLOPs.

    ``kind`` is ``matmul``, ``factor`` (a Cholesky factorisation) or ``solve`` (the
    triangular solves against a factor).
    """

    name: str
    layer: int
    kind: str
    flops: float


def _mm(name: str, layer: int, m: int, k: int, n: int) -> FlopCount:
    return FlopCount(name, layer, "matmul", 2.0 * m * k * n)


def _gram(name: str, layer: int, rows: int, cols: int) -> list[FlopCount]:
    """The Gram x^T x of x [rows, cols] as ``updates._gram`` computes it (its row strips)."""
    edges = gram_strips(cols)
    return [_mm(name, layer, hi - lo, rows, cols - lo) for lo, hi in itertools.pairwise(edges)]


def _factor(name: str, layer: int, n: int) -> FlopCount:
    return FlopCount(name, layer, "factor", n**3 / 3)


def _solve(name: str, layer: int, n: int, rhs: int) -> FlopCount:
    return FlopCount(name, layer, "solve", 2.0 * n * n * rhs)


def _p_step(l: int, n: int, n_in: int, n_out: int) -> list[FlopCount]:
    if n_out <= n_in:
        return [
            _mm("W W^T", l, n_out, n_in, n_out),
            _factor("chol K", l, n_out),
            _solve("K^-1 W", l, n_out, n_in),
            _mm("v W^T", l, n, n_in, n_out),
            _mm("r M", l, n, n_out, n_in),
        ]
    return [
        _mm("W^T W", l, n_in, n_out, n_in),
        _factor("chol H", l, n_in),
        _solve("H^-1", l, n_in, n_in),
        _mm("(z-b) W", l, n, n_out, n_in),
        _mm("rhs H^-1", l, n, n_in, n_in),
    ]


def _wb_step(l: int, n: int, n_in: int, n_out: int, gram_kept: bool) -> list[FlopCount]:
    if samples_side(n, n_in):
        return [
            *([] if gram_kept else _gram("p p^T", l, n_in, n)),
            _mm("p W^T (prox)", l, n, n_in, n_out),
            _factor("chol K", l, n),
            _solve("R", l, n, n_out),
            _mm("R p", l, n_out, n, n_in),
        ]
    return [
        *([] if gram_kept else _gram("p^T p", l, n, n_in)),
        _mm("z^T p", l, n_out, n, n_in),
        _factor("chol G", l, n_in),
        _solve("W", l, n_in, n_out),
    ]


def iteration_flops(
    widths: Sequence[int],
    n: int,
    layers: Sequence[int] | None = None,
    data_gram_kept: bool = True,
) -> list[FlopCount]:
    """The counted operations of one full-batch iteration of an MLP's pdADMM block.

    Args:
        widths: n_0 (the input features), n_1, ..., n_L of the network.
        n: samples N.
        layers: the block's layers (default: every layer, a serial iteration).
        data_gram_kept: whether layer 0's Gram of the data is kept from an earlier
            iteration (the block does so after its first, in a 1-D run).

    Returns:
        One :class:`FlopCount` per operation, layer by layer, in the iteration's order
        within each phase (p-steps, then (W, b)-steps and a).

    Raises:
        ValueError: fewer than two widths, or a layer outside the network.

    Example:
        >>> sum(c.flops for c in iteration_flops([196, 500, 10], 10_000)) / 1e9
        7.53...
    """
    L = len(widths) - 1
    if L < 1:
        raise ValueError(f"widths must name at least one layer (widths: {list(widths)})")
    owned = list(range(L)) if layers is None else list(layers)
    if any(not 0 <= l < L for l in owned):
        raise ValueError(f"layers must lie in 0..{L - 1} (layers: {owned})")
    out = [c for l in owned if l > 0 for c in _p_step(l, n, widths[l], widths[l + 1])]
    for l in owned:
        n_in, n_out = widths[l], widths[l + 1]
        out += _wb_step(l, n, n_in, n_out, gram_kept=l == 0 and data_gram_kept)
        out.append(_mm("a = p W^T", l, n, n_in, n_out))
    return out
