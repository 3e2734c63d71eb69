"""OpBlock: ``LayerBlock`` written over layer operators, so dense and conv layers share one block.

A prototype for wiring conv layers into the ``admm`` strategy: the same variables, phases and
boundary copies as ``blocks.LayerBlock`` (so ``driver.serial_iteration`` and
``driver.distributed_iteration`` run it unchanged), with every ``p @ W.T + b`` and every
subproblem solve delegated to the layer's operator (``layers.DenseOp`` / ``layers.ConvOp``).
For an MLP (all ``DenseOp``) it computes what ``LayerBlock`` computes; it is meant to replace
``LayerBlock``, not to live beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from deepjimu.strategies.admm import updates as U
from deepjimu.strategies.admm.blocks import AdmmParams
from deepjimu.strategies.admm.conv import PSolver
from deepjimu.strategies.admm.layers import ConvOp, LayerOp
from deepjimu.strategies.admm.quantize import project

__all__ = ["OpBlock"]


class OpBlock:
    """Layers ``lo .. hi-1`` of an L-layer network given by their operators; p, q, u keep the
    operators' own shapes ([N, C, H, W] for conv layers), not pooled.

    ``p[l]`` is the input of layer l (``p[0]`` is the data and never updated), ``q[l]`` the
    output of layer l and ``u[l]`` the dual of ``p[l+1] = q[l]``. At a block boundary the block
    keeps ``q_left``/``u_left`` of layer lo-1 and ``p_right`` of layer hi, as ``LayerBlock``.
    ``cg_iters`` / ``cg_solves`` / ``cg_hits`` count the CG iterations, CG p-steps and the
    p-steps that stopped at the cap.

    Args:
        lo, hi, L: owned layers and the total layer count.
        ops: the owned layers' operators.
        W, b: the owned layers' weights and biases.
        params: rho, nu, quantization bits, tau, ...
    """

    def __init__(
        self,
        lo: int,
        hi: int,
        L: int,
        ops: Sequence[LayerOp],
        W: Sequence[Tensor],
        b: Sequence[Tensor],
        params: AdmmParams,
    ) -> None:
        assert 0 <= lo < hi <= L and len(ops) == len(W) == len(b) == hi - lo
        self.lo, self.hi, self.L = lo, hi, L
        self.params = params
        self.ops = dict(zip(range(lo, hi), ops, strict=True))
        self.W = dict(zip(range(lo, hi), W, strict=True))
        self.b = dict(zip(range(lo, hi), b, strict=True))
        self.p: dict[int, Tensor] = {}
        self.z: dict[int, Tensor] = {}
        self.q: dict[int, Tensor] = {}
        self.u: dict[int, Tensor] = {}
        self.q_left: Tensor | None = None
        self.u_left: Tensor | None = None
        self.p_right: Tensor | None = None
        self.zlast_hits = 0
        self.cg_iters = self.cg_solves = self.cg_hits = 0
        self._data_gram: Tensor | None = None

    @property
    def layers(self) -> range:
        return range(self.lo, self.hi)

    def _grid(self, t: Tensor) -> Tensor:
        return project(t, self.params.bits) if self.params.bits else t

    def _a(self, l: int) -> Tensor:
        return self.ops[l].forward(self.p[l], self.W[l], self.b[l])

    # ---- initialisation ---------------------------------------------------------------------
    @torch.no_grad()
    def init_forward(self, p_in: Tensor) -> Tensor:
        """Set z, q, p by a forward pass from the block input; u = 0. Returns the block output."""
        self.p[self.lo] = p_in if self.lo == 0 else self._grid(p_in)
        self._data_gram = None
        if self.lo > 0:
            self.q_left, self.u_left = self.p[self.lo], torch.zeros_like(p_in)
        out = p_in
        for l in self.layers:
            a = self._a(l)
            self.z[l] = a
            if l == self.L - 1:
                return a
            self.q[l] = self._grid(torch.relu(a))
            self.u[l] = torch.zeros_like(a)
            out = self.q[l]
            if l + 1 < self.hi:
                self.p[l + 1] = out
        return out

    # ---- one iteration: p -> (W, b) -> z -> q -> u ------------------------------------------
    def _q_prev(self, l: int) -> tuple[Tensor, Tensor]:
        if l == self.lo:
            assert self.q_left is not None and self.u_left is not None
            return self.q_left, self.u_left
        return self.q[l - 1], self.u[l - 1]

    def _p_next(self, l: int) -> Tensor:
        if l + 1 == self.hi:
            assert self.p_right is not None, "p_right must be received before the q step"
            return self.p_right
        return self.p[l + 1]

    @torch.no_grad()
    def step_p(self) -> None:
        """p-subproblem of every owned layer l >= 1 (the operator's solve), then the grid."""
        rho, nu = self.params.rho, self.params.nu
        for l in self.layers:
            if l == 0:
                continue
            q_prev, u_prev = self._q_prev(l)
            op = self.ops[l]
            sol = op.solve_p(self.W[l], self.b[l], self.z[l], q_prev, u_prev, rho, nu, self.p[l])
            if isinstance(op, ConvOp) and op.solver is PSolver.CG:
                self.cg_solves += 1
                self.cg_iters += sol.iterations
            self.cg_hits += int(not sol.converged)
            self.p[l] = self._grid(sol.p)

    @torch.no_grad()
    def step_wbz(self, y: Tensor | None) -> None:
        """(W, b) jointly exact, then z; ``a`` is computed once per layer and reused."""
        nu, tau = self.params.nu, self.params.tau
        for l in self.layers:
            gram = None
            if l == 0:  # p_0 is the data: its centred Gram matrix is the same every iteration
                if self._data_gram is None:
                    self._data_gram = self.ops[0].gram(self.p[0])
                gram = self._data_gram
            self.W[l], self.b[l] = self.ops[l].solve_Wb(
                self.p[l], self.z[l], self.W[l], nu, tau=tau, gram=gram
            )
            a = self._a(l)
            if l == self.L - 1:
                assert y is not None, "the last layer needs the labels"
                sol = U.update_z_last(a, y, self.z[l], nu, max_iter=self.params.zlast_iters)
                self.z[l] = sol.z
                self.zlast_hits += int(not sol.converged)
            else:
                self.z[l] = U.update_z_hidden(a, self.q[l], self.z[l])

    @torch.no_grad()
    def step_qu(self) -> None:
        """q (then its grid projection) and u of every owned layer l < L-1."""
        rho, nu = self.params.rho, self.params.nu
        for l in self.layers:
            if l == self.L - 1:
                continue
            p_next = self._p_next(l)
            self.q[l] = self._grid(U.update_q(p_next, self.u[l], self.z[l], rho, nu))
            self.u[l] = U.update_u(self.u[l], p_next, self.q[l], rho)

    @torch.no_grad()
    def step_left_dual(self) -> None:
        """Keep u_{lo-1} in step with the left neighbour (see ``LayerBlock.step_left_dual``)."""
        assert self.q_left is not None and self.u_left is not None
        self.u_left = U.update_u(self.u_left, self.p[self.lo], self.q_left, self.params.rho)

    # ---- what crosses a boundary ------------------------------------------------------------
    def first_p(self) -> Tensor:
        """p_lo, sent to the left neighbour."""
        return self.p[self.lo]

    def last_q(self) -> Tensor:
        """q_{hi-1}, sent to the right neighbour."""
        return self.q[self.hi - 1]

    # ---- diagnostics --------------------------------------------------------------------------
    @torch.no_grad()
    def objective_and_residual(self, y: Tensor | None) -> tuple[float, float]:
        """This block's share of the augmented Lagrangian and of ||p_{l+1} - q_l||^2."""
        rho, nu = self.params.rho, self.params.nu
        obj, res = 0.0, 0.0
        for l in self.layers:
            a = self._a(l)
            if l == self.L - 1:
                assert y is not None
                obj += float(U.last_layer_objective(a, self.z[l], y, nu))
                continue
            p_next = self._p_next(l)
            obj += float(U.layer_lagrangian(a, self.z[l], self.q[l], self.u[l], p_next, rho, nu))
            res += float(((p_next - self.q[l]) ** 2).sum())
        return obj, res

    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:
        """The network function of the owned layers (ReLU between layers, none after the last)."""
        for l in self.layers:
            x = self.ops[l].forward(x, self.W[l], self.b[l])
            if l < self.L - 1:
                x = torch.relu(x)
        return x

    def loss(self, logits: Tensor, y: Tensor) -> float:
        """Mean cross-entropy, as the gradient strategies report it."""
        return float(F.cross_entropy(logits, y))

    # ---- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every variable, for a checkpoint (tensors moved to the CPU)."""

        def cpu(d: dict[int, Tensor]) -> dict[int, Tensor]:
            return {k: v.cpu() for k, v in d.items()}

        opt = {k: getattr(self, k) for k in ("q_left", "u_left", "p_right")}
        return {
            "W": cpu(self.W), "b": cpu(self.b), "p": cpu(self.p), "z": cpu(self.z), "q": cpu(self.q),
            "u": cpu(self.u), **{k: None if v is None else v.cpu() for k, v in opt.items()},
            "rho": self.params.rho, "nu": self.params.nu,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Restore :meth:`state_dict` onto ``device``."""
        for k in ("W", "b", "p", "z", "q", "u"):
            setattr(self, k, {int(i): v.to(device) for i, v in state[k].items()})
        for k in ("q_left", "u_left", "p_right"):
            setattr(self, k, None if state[k] is None else state[k].to(device))
        self._data_gram = None
        self.params.rho, self.params.nu = state["rho"], state["nu"]
