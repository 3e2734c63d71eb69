"""Layer operators: what pdADMM needs to know of one layer z = A(P p) + b, dense or convolutional.

A layer operator is stateless: it knows shapes, the fixed map P folded in front of it
(average pooling and/or flattening) and how to solve its layer's subproblems; the variables
p, W, b, z, q, u stay with the caller (a ``blocks.LayerBlock``), exactly as with ``updates.py``.

    forward(p, W, b)      a = A(P p) + b, for the z-step, the objective and evaluation
    solve_Wb(p, z, W)     the exact (W, b) step; gram(p) its normal matrix, constant for the data
    wb_rows(p, z)         the (W, b) least squares' rows and targets, to pool over replicas;
    solve_Wb_stats(...)   the step over pooled statistics (``updates.pool_stats``)
    solve_p(...)          the p step (exact, or CG with its iteration count)
    flops(N), nbytes(N)   estimates for the balancer: flops of one iteration, bytes of variables

:func:`layer_ops` reads them off an ``nn.Sequential`` built by ``deepjimu.models`` (``mlp`` or
``cnn``) and refuses, in one line, what pdADMM cannot train (max pooling, normalisation, ...).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import cast

from torch import Tensor, nn

from deepjimu.admm_math import conv as C
from deepjimu.admm_math import updates as U
from deepjimu.errors import JimuError

__all__ = ["CG_ITERS", "ConvOp", "DenseOp", "LayerOp", "layer_ops"]

CG_ITERS = 4.0
"""CG iterations per conv p-step assumed when choosing solvers: on digits (cnn:16-32, rho = nu = 1,
tol 1e-3, warm start) the mean was 3.4, and 0.3 to 0.7 at rho = 10 or with 4 conv layers."""


@dataclass(frozen=True)
class DenseOp:
    """z = flatten(P p) W^T + b: a hidden MLP layer (pool = 1, flat p) or a CNN's classifier.

    Attributes:
        in_shape: one sample's p, (n_in,) or (C, H_in, W_in).
        n_out: output units.
        pool: k of the average pooling folded in front (1: none).
    """

    in_shape: tuple[int, ...]
    n_out: int
    pool: int = 1

    @property
    def n_in(self) -> int:
        """Inputs of the matrix W: C H W of the pooled map, or n_in."""
        if len(self.in_shape) == 1:
            return self.in_shape[0]
        c, h, w = self.in_shape
        return c * (h // self.pool) * (w // self.pool)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.n_out,)

    def _x(self, p: Tensor) -> Tensor:
        return C.avg_pool(p, self.pool).flatten(1) if p.dim() > 2 else p

    def forward(self, p: Tensor, W: Tensor, b: Tensor) -> Tensor:
        """a = flatten(P p) W^T + b, [N, n_out]."""
        return U.linear(self._x(p), W, b)

    def gram(self, p: Tensor) -> Tensor:
        """The centred Gram matrix :meth:`solve_Wb` solves with (constant for the data: cache it)."""
        return U.centred_gram(self._x(p))

    def solve_Wb(
        self,
        p: Tensor,
        z: Tensor,
        W: Tensor,
        nu: float,
        *,
        tau: float = 0.0,
        ridge: float = 0.0,
        gram: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``updates.update_Wb`` on flatten(P p)."""
        return U.update_Wb(self._x(p), z, W, nu, tau=tau, ridge=ridge, gram=gram)

    def wb_rows(self, p: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """The rows and targets of the (W, b) least squares: flatten(P p) and z."""
        return self._x(p), z

    def solve_Wb_stats(
        self, stats: U.WbStats, W: Tensor, nu: float, *, tau: float = 0.0, ridge: float = 0.0
    ) -> tuple[Tensor, Tensor]:
        """:meth:`solve_Wb` over the samples that ``stats`` summarises."""
        return U.update_Wb_stats(stats, W, nu, tau=tau, ridge=ridge)

    def solve_p(
        self, W: Tensor, b: Tensor, z: Tensor, q_prev: Tensor, u_prev: Tensor, rho: float, nu: float,
        p_old: Tensor | None = None,
    ) -> C.ConvPSolve:  # fmt: skip
        """Exact: ``updates.update_p``, through the pooling fold when p is a map."""
        if q_prev.dim() == 2:
            return C.ConvPSolve(U.update_p(W, b, z, q_prev, u_prev, rho, nu), 0, True)
        return C.ConvPSolve(
            C.update_p_flat(W, b, z, q_prev, u_prev, rho, nu, pool=self.pool), 0, True
        )

    def flops(self, n_samples: int, *, with_p: bool = True) -> float:
        """One iteration: (W, b) N (2 n_in n_out + n_in s) + s^3 / 3 with s = min(N, n_in), the
        side that ``updates.update_Wb`` factorises (the Gram or kernel matrix, z^T p,
        a = p W^T and the Cholesky), and the p-step (``with_p``; not for layer 1)
        2 N n_in n_out + n_in^3 / 3. Wide inputs and few samples (Cora's 7,165 features and
        140 nodes) cost N^2 n_in, not n_in^3: the estimate follows the solve."""
        n_in, n_out = self.n_in, self.n_out
        s = n_samples if U.samples_side(n_samples, n_in) else n_in
        c = n_samples * (2 * n_in * n_out + n_in * s) + s**3 / 3
        if with_p:
            c += 2 * n_samples * n_in * n_out + n_in**3 / 3
        return float(c)

    def nbytes(self, n_samples: int) -> float:
        """float32 p (not pooled), z, q, u, W and b."""
        return 4.0 * (
            n_samples * (math.prod(self.in_shape) + 3 * self.n_out) + (self.n_in + 1) * self.n_out
        )


@dataclass(frozen=True)
class ConvOp:
    """z = conv(P p, W) + b, 'same' padding, stride 1, s x s kernel.

    Attributes:
        in_shape: one sample's p, (C_in, H_in, W_in), not pooled.
        c_out: output channels.
        kernel: s (odd).
        pool: k of the average pooling folded in front (1: none).
        solver: how the p-step is solved (``conv.PSolver``).
        cg_tol, cg_max_iter: CG's relative residual per sample and iteration cap.
    """

    in_shape: tuple[int, int, int]
    c_out: int
    kernel: int = 3
    pool: int = 1
    solver: C.PSolver = C.PSolver.CG
    cg_tol: float = 1e-3
    cg_max_iter: int = 50

    @property
    def map_shape(self) -> tuple[int, int, int]:
        """(C_in, H, W) of the pooled input, the map the conv runs on."""
        c, h, w = self.in_shape
        return c, h // self.pool, w // self.pool

    @property
    def out_shape(self) -> tuple[int, ...]:
        _, h, w = self.map_shape
        return self.c_out, h, w

    def forward(self, p: Tensor, W: Tensor, b: Tensor) -> Tensor:
        """a = conv(P p, W) + b, [N, C_out, H, W]."""
        return C.conv_forward(C.avg_pool(p, self.pool), W, b)

    def gram(self, p: Tensor) -> Tensor:
        """The centred Gram of the im2col patches of P p, [C_in s^2, C_in s^2] (cache it for the data)."""
        return U.centred_gram(C.patch_rows(C.avg_pool(p, self.pool), self.kernel))

    def solve_Wb(
        self,
        p: Tensor,
        z: Tensor,
        W: Tensor,
        nu: float,
        *,
        tau: float = 0.0,
        ridge: float = 0.0,
        gram: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``conv.update_Wb_conv``: least squares over the im2col patches of P p."""
        return C.update_Wb_conv(p, z, W, nu, pool=self.pool, tau=tau, ridge=ridge, gram=gram)

    def wb_rows(self, p: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """The rows and targets of the (W, b) least squares: the im2col patch rows of P p
        and z pixel by pixel (every pixel a row, as ``conv.update_Wb_conv`` solves)."""
        rows = C.patch_rows(C.avg_pool(p, self.pool), self.kernel)
        return rows, z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])

    def solve_Wb_stats(
        self, stats: U.WbStats, W: Tensor, nu: float, *, tau: float = 0.0, ridge: float = 0.0
    ) -> tuple[Tensor, Tensor]:
        """:meth:`solve_Wb` over the samples that ``stats`` summarises."""
        W_flat, b = U.update_Wb_stats(stats, W.reshape(W.shape[0], -1), nu, tau=tau, ridge=ridge)
        return W_flat.view_as(W), b

    def solve_p(
        self, W: Tensor, b: Tensor, z: Tensor, q_prev: Tensor, u_prev: Tensor, rho: float, nu: float,
        p_old: Tensor | None = None,
    ) -> C.ConvPSolve:  # fmt: skip
        """``conv.update_p_conv`` with this layer's solver, warm-started from ``p_old``."""
        return C.update_p_conv(
            W, b, z, q_prev, u_prev, rho, nu, pool=self.pool, p_old=p_old, solver=self.solver,
            tol=self.cg_tol, max_iter=self.cg_max_iter,
        )  # fmt: skip

    def flops(self, n_samples: int, *, with_p: bool = True, cg_iters: float = CG_ITERS) -> float:
        """One iteration, m = C_in s^2 patch columns: (W, b) N H W (2 m C_out + m^2) + m^3 / 3 (the
        patch Gram dominates: N H W m^2, the cost the issue names, N H W C_in C_out s^2, times
        m / C_out); the p-step (``with_p``) ``cg_iters`` CG iterations, or DENSE's GEMMs plus
        building and factorising its matrix."""
        c_in, h, w = self.map_shape
        m = c_in * self.kernel**2
        c = n_samples * h * w * (2 * m * self.c_out + m * m) + m**3 / 3
        if with_p:
            cg, dense = C.conv_p_flops(self.map_shape, self.c_out, self.kernel)
            if self.solver is C.PSolver.CG:
                c += n_samples * cg_iters * cg
            else:
                n = c_in * h * w
                c += n_samples * dense + n * cg / 2 + n**3 / 3
        return float(c)

    def nbytes(self, n_samples: int) -> float:
        """float32 p (not pooled), z, q, u, W, b, and the im2col patches of the (W, b) step."""
        c_in, h, w = self.map_shape
        m = c_in * self.kernel**2
        variables = n_samples * (math.prod(self.in_shape) + 3 * self.c_out * h * w)
        return 4.0 * (variables + n_samples * h * w * m + (m + 1) * self.c_out)


LayerOp = DenseOp | ConvOp


def layer_ops(
    model: nn.Sequential,
    feature_shape: tuple[int, ...],
    *,
    cg_iters: float = CG_ITERS,
    cg_max_iter: int = 50,
) -> list[DenseOp | ConvOp]:
    """One operator per block of an ``mlp`` or ``cnn`` model, pooling folded into the next layer.

    Each block must be ``[Flatten,] Linear[, ReLU]`` or ``Conv2d, ReLU[, AvgPool2d]`` with
    one linear map per block and ReLU on every block but the last. Each conv layer's p-step
    solver is ``conv.choose_p_solver`` for ``cg_iters`` expected CG iterations.

    Args:
        model: the ``nn.Sequential`` of blocks.
        feature_shape: one sample's input shape, e.g. (1, 8, 8).
        cg_iters: CG iterations a p-step is expected to take.
        cg_max_iter: CG's iteration cap of every conv p-step (``--admm-cg-iters``).

    Returns:
        The operators, in model order.

    Raises:
        JimuError: a block pdADMM cannot train (max pooling, normalisation, a stride, ...).
    """
    ops: list[DenseOp | ConvOp] = []
    shape, pool = tuple(feature_shape), 1
    last = len(model) - 1
    for i, block in enumerate(model):
        mods = list(block) if isinstance(block, nn.Sequential) else [block]
        kinds = [type(m).__name__ for m in mods]
        where = f"block {i}: {'-'.join(kinds)}"
        if "MaxPool2d" in kinds:
            raise JimuError(
                f"admm cannot train max pooling ({where}): it is not linear; "
                "use a cnn:C1-C2-... model (average pooling)"
            )
        if kinds and kinds[0] == "Flatten":
            mods, kinds = mods[1:], kinds[1:]
        want_relu = ["ReLU"] if i < last else []
        if kinds == ["Linear", *want_relu]:
            lin = cast(nn.Linear, mods[0])
            dense = DenseOp(shape, lin.out_features, pool)
            if lin.in_features != dense.n_in:
                raise JimuError(
                    f"admm: {where} expects {lin.in_features} inputs, gets {dense.n_in}"
                )
            ops.append(dense)
            shape, pool = (lin.out_features,), 1
            continue
        if kinds in (["Conv2d", *want_relu], ["Conv2d", *want_relu, "AvgPool2d"]) and i < last:
            conv = cast(nn.Conv2d, mods[0])
            s = conv.kernel_size[0]
            if (
                conv.kernel_size != (s, s) or s % 2 == 0 or conv.stride != (1, 1)
                or conv.padding not in ((s // 2, s // 2), "same") or conv.dilation != (1, 1) or conv.groups != 1
                or conv.bias is None or len(shape) != 3
            ):  # fmt: skip
                raise JimuError(
                    f"admm trains 'same' convolutions with odd square kernels, stride 1, bias ({where})"
                )
            op = ConvOp(shape, conv.out_channels, s, pool)  # type: ignore[arg-type]
            solver = C.choose_p_solver(op.map_shape, op.c_out, s, cg_iters=cg_iters)
            ops.append(dataclasses.replace(op, solver=solver, cg_max_iter=cg_max_iter))
            next_pool = 1
            if kinds[-1] == "AvgPool2d":
                k = mods[-1].kernel_size
                pooling = mods[-1]
                if (
                    not isinstance(k, int)
                    or pooling.stride != k
                    or pooling.padding != 0
                    or pooling.ceil_mode
                ):
                    raise JimuError(
                        f"admm folds only non-overlapping k x k average pooling ({where})"
                    )
                next_pool = k
            shape, pool = ops[-1].out_shape, next_pool
            continue
        raise JimuError(
            f"admm cannot train {where}: it needs [Flatten,] Linear[, ReLU] or "
            "Conv2d, ReLU[, AvgPool2d] blocks (an mlp:... or cnn:... model)"
        )
    return ops
