"""LayerBlock: the pdADMM variables of the contiguous layers one worker owns, and their steps."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from deepjimu.admm_math import updates as U
from deepjimu.admm_math.conv import PSolver
from deepjimu.admm_math.quantize import Change, change, project
from deepjimu.admm_math.wire import per_row
from deepjimu.strategies.admm.layers import ConvOp, DenseOp, LayerOp
from deepjimu.strategies.admm.pooled import Pool
from deepjimu.strategies.admm.pooled import mean as pooled_mean
from deepjimu.strategies.admm.pooled import means as pooled_means
from deepjimu.strategies.admm.pooled import rms as pooled_rms
from deepjimu.strategies.admm.pooled import solve_Wb as pooled_Wb
from deepjimu.strategies.admm.pooled import span as pooled_span
from deepjimu.strategies.admm.pooled import stats as pooled_stats
from deepjimu.strategies.admm.pooled import stats_all as pooled_stats_all

__all__ = [
    "CNN_DEFAULTS",
    "DEEP_MLP",
    "MLP_DEFAULTS",
    "AdmmParams",
    "LayerBlock",
    "auto_defaults",
    "auto_init",
    "auto_inner",
    "has_conv",
    "sample_nbytes",
]


DEEP_MLP = 8
"""Layers from which an MLP starts as the identity (``--admm-init auto``). With torch's
default initialisation a ReLU layer shrinks its activations' RMS by about 0.4, so a deep
net's last layers start with activations too small for the absolute penalties to couple
them: the scaled start alone lifted mlp:500x10 (11 layers) on the MNIST subset from 62.9% to
80.0%, and with the other defaults to 92.5%. But each of its random layers still scrambles
what the labels' signal must cross to reach the first ones: at 21 layers the scaled start's
iterate stayed at chance. Started as the identity, mlp:500x10 reaches 94.3% and mlp:500x20
93.6% (BENCHMARKS.md section 5), while on mlp:500x6 (7 layers) the identity gave 94.0%
against the forward start's 94.8%, and on mlp:256x3 92.4% against 94.4%."""


# the smallest relative ridge of the readout's refits: without the iteration's proximal term
# a least squares on ReLU features (dead units, constant pixels) can be singular, and then
# ill-conditioned enough that the pseudo-inverse fails (mlp:500x10 at ridge 0 on the MNIST
# subset); input noise of 1e-5 of the mean variance changes no fit that is well posed
READOUT_RIDGE = 1e-5


def has_conv(ops: Sequence[LayerOp]) -> bool:
    """Whether any layer is a conv layer (the MLP-only options and defaults ask)."""
    return any(isinstance(op, ConvOp) for op in ops)


def auto_init(ops: Sequence[LayerOp]) -> str:
    """The start ``--admm-init auto`` picks: unit for CNNs, identity for deep MLPs, else forward."""
    if has_conv(ops):
        return "unit"
    return "identity" if len(ops) >= DEEP_MLP else "forward"


def auto_inner(ops: Sequence[LayerOp]) -> int:
    """The iterations per mini-batch ``--admm-inner 0`` picks: 4 per layer for deep MLPs, else 2.

    Each mini-batch restarts its auxiliary variables from a forward pass, so its W steps fit
    targets that only its own inner iterations have moved towards the labels. On the MNIST
    subset (batch 500, BENCHMARKS.md section 5) 4 per layer instead of 2 took mlp:500x10
    from 0.898 to 0.913 after 5 epochs and was ahead at equal time (0.905 after 2 epochs,
    111 s, against 0.898 after 5, 137 s); mlp:500x6 from 0.936 to 0.942 (at equal time about
    even: 0.935 at 38 s against 0.933 at 42 s); and cost mlp:256x3 0.4 points in twice the
    time. So MLPs of :data:`DEEP_MLP` layers or more take 4, the others (and CNNs,
    not measured) 2.
    """
    deep_mlp = not has_conv(ops) and len(ops) >= DEEP_MLP
    return (4 if deep_mlp else 2) * len(ops)


MLP_DEFAULTS = {"ridge": 0.01, "momentum": 0.7, "sweeps": 1, "memory": 0.8}
"""admm's defaults for MLPs. On the MNIST subset (BENCHMARKS.md section 5) the ridge alone
lifts mlp:256x3 from 92.0% to 93.3% and momentum 0.7 alone to 91.4% at 10 iterations (86.0%
base); together with the sweep, mlp:256x3 averages 93.16% over 5 seeds (Adam 94.20%) and
mlp:500x10 reaches 90.6% (62.9% base); with the readout (``--admm-readout auto``) 94.14%
and 92.4%. In mini-batch mode (batch 500, 10 epochs) these with
memory 0.8 give 93.5%, against 89.8% with every option off."""

CNN_DEFAULTS = {"ridge": 0.0, "momentum": 0.5, "sweeps": 0, "memory": 0.0}
"""admm's defaults for CNNs (BENCHMARKS.md section 12, digits, 2 workers). The ridge that helps
MLPs breaks deep CNNs: cnn:16-16-16-16-32-32-32-32 0.900 without, 0.767 at 0.001, 0.531 at
0.003; on cnn:16-32 it is noise (0.978 / 0.981) except with 8-bit exchange, where 0.003 gives
0.978 against 0.961 (after the float32-sum fix; with the readout, 8 bits reach 0.983 at
ridge 0). A start-up sweep gave cnn:16-32 0.964-0.967. The statistics of ``memory`` are
those of dense layers."""


def auto_defaults(
    ops: Sequence[LayerOp], given: Mapping[str, float | None] | None = None
) -> dict[str, float]:
    """ridge, momentum, sweeps and memory for a model of these layer operators: the model
    kind's defaults, each replaced by its value in ``given`` where that is not None (the
    user's flag or keyword)."""
    chosen = dict(CNN_DEFAULTS if has_conv(ops) else MLP_DEFAULTS)
    return chosen | {k: v for k, v in (given or {}).items() if k in chosen and v is not None}


@dataclass
class AdmmParams:
    """Hyper-parameters of one pdADMM iteration.

    ``bits`` (8 or 16) puts every p and q on a quantization grid (pdADMM-G-Q), so the
    values that cross a worker boundary are exactly representable by their integer codes;
    ``bits`` 2 or 4 puts every change of p and q on a grid of its own, one per sample
    (``quantize.change``: the new value is the old one plus the change on that grid).
    ``tau`` is the proximal weight (tau/2)||W - W_old||^2 of every (W, b) step: it keeps the
    step well posed where p^T p is singular and acts as the step size of W (larger: slower).
    ``ridge`` is the relative ridge of every (W, b) step (``updates.ridge_weight``: the
    ridge that input noise of ``ridge`` times the layer's mean input variance would add):
    it keeps the exact least-squares fits from putting large weights on directions in which
    the inputs barely vary (the blank border pixels; the per-sample slack of the auxiliary
    variables), which fit the training set and nothing else.
    ``momentum`` extrapolates every variable but p after each iteration, x + momentum
    (x - x_prev) (0: off; :meth:`LayerBlock.extrapolate`). ``memory`` (mini-batch mode) is
    the decay of the batches' (W, b) statistics: each W step solves the problem over all
    batches seen, older ones weighted down by ``memory`` per batch (0: only the current
    batch and the proximal term).
    """

    rho: float = 1.0
    nu: float = 1.0
    bits: int = 0
    tau: float = 1.0
    ridge: float = 0.0
    zlast_iters: int = 50
    momentum: float = 0.0
    memory: float = 0.0

    @classmethod
    def of(
        cls, rho: float, nu: float, bits: int, tau: float, chosen: Mapping[str, float]
    ) -> AdmmParams:
        """The parameters of a run (``jimu train``'s options or ``PdADMM``'s keywords) with
        the model kind's ridge, momentum and memory ``chosen`` (:func:`auto_defaults`)."""
        return cls(
            rho=rho, nu=nu, bits=bits, tau=tau, ridge=float(chosen["ridge"]),
            momentum=float(chosen["momentum"]), memory=float(chosen["memory"]),
        )  # fmt: skip


class LayerBlock:
    """Layers ``lo .. hi-1`` of an L-layer network (an MLP or a CNN): W, b, p, z, q, u, samples first.

    ``p[l]`` is the input of layer l (``p[0]`` is the data and never updated), ``q[l]`` the
    output of layer l and ``u[l]`` the dual of the link ``p[l+1] = q[l]`` (l < L-1). At a
    block boundary the block keeps copies: ``q_left``/``u_left`` of layer lo-1 (received /
    kept in step locally) and ``p_right`` of layer hi (received). Methods are the phases of
    one Jacobi iteration; they compute and never communicate. Every ``a = A(P p) + b`` and
    every p and (W, b) solve is the layer operator's (``layers.DenseOp`` / ``layers.ConvOp``),
    so p, q, u keep the operators' own shapes ([N, C, H, W] for a conv layer, not pooled).
    ``cg_iters`` / ``cg_solves`` / ``cg_hits`` count the CG iterations, the CG p-steps and
    the p-steps that stopped at the CG cap; ``zlast_hits`` the z_L solves that hit theirs.

    Args:
        lo, hi, L: owned layers and the total layer count.
        W, b: the owned layers' weights ([n_l, n_{l-1}] or [C_out, C_in, s, s]) and biases.
        params: rho, nu, quantization bits, ...
        ops: the owned layers' operators (default: dense layers on flat inputs, an MLP).
    """

    def __init__(
        self,
        lo: int,
        hi: int,
        L: int,
        W: Sequence[Tensor],
        b: Sequence[Tensor],
        params: AdmmParams,
        ops: Sequence[LayerOp] | None = None,
    ) -> None:
        assert 0 <= lo < hi <= L and len(W) == len(b) == hi - lo
        self.lo, self.hi, self.L = lo, hi, L
        self.params = params
        if ops is None:
            ops = [DenseOp((w.shape[1],), w.shape[0]) for w in W]
        self.ops: dict[int, LayerOp] = dict(zip(range(lo, hi), ops, strict=True))
        self.W, self.b = (
            dict(zip(range(lo, hi), W, strict=True)),
            dict(zip(range(lo, hi), b, strict=True)),
        )
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
        self.stats: dict[int, U.WbStats | None] = {l: None for l in self.layers}
        # --admm-aux keep: the (W, b) statistics of every sample outside the current batch; and
        # (both mini-batch modes) the current batch's of its last (W, b) step, layer by layer
        self.others: dict[int, U.WbStats | None] | None = None
        self.batch_part: dict[int, U.WbStats] = {}
        self._prev: dict[str, Any] | None = None  # the previous iterate, for momentum
        # while recording (the clock to take them on), each (W, b, z) step keeps the layer's
        # a-dependent terms of the objective (:meth:`objective_and_residual`), from the a it
        # has just computed
        self.recording: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
        self._terms: dict[int, Tensor] = {}
        # the readout's refitted weights and the last layer's plain input (readout_forward)
        self.refit_Wb: dict[int, tuple[Tensor, Tensor]] = {}
        self.last_Wb: tuple[Tensor, Tensor] | None = None
        # the iterate's own (training loss, accuracy) at the last readout that ran its
        # forward pass: what the health check judges, whichever readout is evaluated
        self.iterate_fit: tuple[float, float] | None = None
        self.readout_features: Tensor | None = None
        # --replicas: this block's replicas, that pool its sums over samples (pooled.py)
        self.pooled: Pool | None = None
        # at 2 and 4 bits, the last change of what crosses a boundary, by what it is: "p"
        # (p_lo), "q" (q_{hi-1}), "plain" and "refit" (the readout's outputs of layer hi-1)
        self.sent: dict[str, Change] = {}

    @property
    def layers(self) -> range:
        return range(self.lo, self.hi)

    def _grid(self, t: Tensor) -> Tensor:
        """t on its grid at 8 and 16 bits; as it is at 2 and 4 bits, where only the changes
        that follow are put on grids (:meth:`_moved`), and unquantized."""
        bits = self.params.bits
        if not bits or per_row(bits):
            return t
        return project(t, bits, pooled_span(t, self.pooled, bits))

    def _moved(self, new: Tensor, old: Tensor, crossing: str | None = None) -> Tensor:
        """The new value of a variable that may cross a boundary, ``old`` its value there: on
        its grid (8, 16 bits), or ``old`` plus the change on the change's grid (2, 4 bits,
        ``quantize.change``), that change kept in :attr:`sent` under ``crossing`` where the
        value crosses (the neighbour holds ``old`` and applies it)."""
        bits = self.params.bits
        if not bits or not per_row(bits):
            return self._grid(new)
        step = change(old, new, bits)
        if crossing is not None:
            self.sent[crossing] = step
        return step.apply(old)

    def _a(self, l: int) -> Tensor:
        """a = A(P p_l) W + b of layer l (``p @ W.T + b`` for a dense layer)."""
        return self.ops[l].forward(self.p[l], self.W[l], self.b[l])

    # ---- initialisation ---------------------------------------------------------------------
    @torch.no_grad()
    def identity_start(self) -> None:
        """Every owned hidden-to-hidden dense layer (0 < l < L-1) with as many outputs as
        inputs becomes the identity: W = I (``torch.nn.init.eye_``), b = 0 (``--admm-init
        identity``). Its input is a ReLU output, never negative, so it passes it on
        unchanged: the network starts as its first and last layers and what the other
        layers keep of them, and the labels' signal reaches the first layers through
        identities rather than random maps (the idea of Le et al., 2015, "A simple way to
        initialize recurrent networks of rectified linear units", and of Zhao et al.,
        2022, "ZerO initialization"). Local to the block: 1 and N workers start alike.
        """
        for l in self.layers:
            W = self.W[l]
            square = isinstance(self.ops[l], DenseOp) and W.shape[0] == W.shape[1]
            if 0 < l < self.L - 1 and square:
                self.W[l] = torch.nn.init.eye_(torch.empty_like(W))
                self.b[l] = torch.zeros_like(self.b[l])

    @torch.no_grad()
    def init_forward(
        self, p_in: Tensor, scale: tuple[float, float] | None = None, *, unit: bool = False
    ) -> tuple[Tensor, tuple[float, float] | None]:
        """Set z, q, p by a forward pass from the block input; u = 0.

        ``p_in`` is the data (lo = 0) or the previous block's output (then also ``q_left``).
        With ``scale`` = (s, r), the block first reparametrises its layers so that each
        one's pre-activations have the root mean square r of the first layer's (r = 0: take
        it from layer 0, which keeps its weights): activations no longer shrink or grow with
        depth (a data-dependent start). s is the factor by which the previous layers
        already multiplied ``p_in`` (1 for the data); layer l's W is multiplied by its own
        factor c and its b by c s, so its pre-activations become s c times the original ones
        (ReLU is positively homogeneous), and s becomes s c. The network's output is the
        original one times a positive constant: the predictions do not change.

        With ``unit`` as well (``--admm-init unit``), every hidden layer l is instead
        divided by the RMS c_l of its ReLU output on ``p_in`` (W_l, b_l / c_l) and the next
        layer's W multiplied by c_l, so every hidden activation has unit RMS and the
        network's output does not change at all (relu(a / c) = relu(a) / c). Here s is c of
        the layer before the block (1 for the data) and r is unused. pdADMM's penalties
        (nu/2)||z - a||^2 and (rho/2)||p - q||^2 are absolute, so a layer whose activations
        are c times smaller is coupled c^2 times more weakly against the loss; a CNN's
        activations shrink layer by layer (torch's init, then average pooling: 0.48 RMS at
        the input, 0.064 at the classifier of cnn:16-32 on digits), which is why CNNs start
        this way by default (BENCHMARKS.md, section 12).

        Returns:
            the block output (the next block's input) and the (s, r) it carries on (None
            without ``scale``).
        """
        self.p[self.lo] = p_in if self.lo == 0 else self._grid(p_in)
        self._data_gram = None
        self._prev = None
        if self.lo > 0:
            self.q_left, self.u_left = self.p[self.lo], torch.zeros_like(p_in)
        out = p_in
        for l in self.layers:
            if scale is not None and unit:
                self.W[l] = self.W[l] * scale[0]
            elif scale is not None:
                self.b[l] = self.b[l] * scale[0]
            a = self._a(l)
            if scale is not None and unit and l < self.L - 1:
                rms = pooled_rms(torch.relu(a), self.pooled)
                c = rms if rms > 0 else 1.0
                self.W[l], self.b[l], a = self.W[l] / c, self.b[l] / c, a / c
                scale = (c, 0.0)
            elif scale is not None and not unit:
                s, r = scale
                rms = pooled_rms(a, self.pooled)
                r = r or rms
                c = r / max(rms, torch.finfo(a.dtype).tiny)
                self.W[l], self.b[l], a = self.W[l] * c, self.b[l] * c, a * c
                scale = (s * c, r)
            self.z[l] = a
            if l == self.L - 1:
                return a, scale
            self.q[l] = self._grid(torch.relu(a))
            self.u[l] = torch.zeros_like(a)
            out = self.q[l]
            if l + 1 < self.hi:
                self.p[l + 1] = out
        # the right neighbour's p_lo starts as this output, which it receives at full precision
        self.p_right = out
        return out, scale

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

    def _p_layer(self, l: int) -> None:
        """p-subproblem of layer l >= 1 (the operator's solve), then the grid."""
        rho, nu = self.params.rho, self.params.nu
        q_prev, u_prev = self._q_prev(l)
        op = self.ops[l]
        sol = op.solve_p(self.W[l], self.b[l], self.z[l], q_prev, u_prev, rho, nu, self.p[l])
        if isinstance(op, ConvOp) and op.solver is PSolver.CG:
            self.cg_solves += 1
            self.cg_iters += sol.iterations
            self.cg_hits += int(not sol.converged)
        self.p[l] = self._moved(sol.p, self.p[l], "p" if l == self.lo else None)

    def _gram_of_data(self) -> Tensor:
        """The centred Gram of layer 0's input p_0, the data: the same every iteration, so cached."""
        if self._data_gram is None:
            self._data_gram = self.ops[0].gram(self.p[0])
        return self._data_gram

    def _wbz_layer(self, l: int, y: Tensor | None, part: U.WbStats | None = None) -> None:
        """(W, b) of layer l jointly exact, then z; ``a = p W^T + b`` is computed once and
        reused. ``part``: this iterate's (p, z) statistics of the layer, pooled already."""
        nu, tau, ridge = self.params.nu, self.params.tau, self.params.ridge
        if self.others is not None or self.params.memory:  # dense layers only (the strategy checks)
            # the other samples' statistics: every other batch as last visited (--admm-aux
            # keep), or the batches seen so far, decayed by --admm-memory. Their rows are gone,
            # so this step solves on the inputs' side (n^2 statistics) whatever N is
            rest, decay = (
                (self.others[l], 1.0)
                if self.others is not None
                else (self.stats[l], self.params.memory)
            )
            self.batch_part[l] = part or pooled_stats(
                self.ops[l], self.p[l], self.z[l], self.pooled
            )
            stats = U.merge_stats(rest, self.batch_part[l], decay)
            self.W[l], self.b[l] = U.update_Wb_stats(stats, self.W[l], nu, tau=tau, ridge=ridge)
        else:  # every row at hand (full batch, or a batch alone): the smaller side's solve
            gram = self._gram_of_data() if l == 0 and self.pooled is None else None
            if part is not None:
                self.W[l], self.b[l] = self.ops[l].solve_Wb_stats(
                    part, self.W[l], nu, tau=tau, ridge=ridge
                )
            else:
                self.W[l], self.b[l] = pooled_Wb(
                    self.ops[l], self.p[l], self.z[l], self.W[l], nu, self.pooled,
                    tau=tau, ridge=ridge, gram=gram, data=l == 0,
                )  # fmt: skip
        a = self._a(l)
        if l == self.L - 1:
            assert y is not None, "the last layer needs the labels"
            sol = U.update_z_last(a, y, self.z[l], nu, max_iter=self.params.zlast_iters)
            self.z[l] = sol.z
            self.zlast_hits += int(not sol.converged)
        else:
            self.z[l] = U.update_z_hidden(a, self.q[l], self.z[l])
        if self.recording is not None:
            with self.recording():
                self._terms[l] = self._a_terms(l, a, y)

    def _a_terms(self, l: int, a: Tensor, y: Tensor | None) -> Tensor:
        """Layer l's terms of the objective that need its a = p W^T + b: the fit
        ||z - a||^2, and for the last layer its whole share, the loss included."""
        if l < self.L - 1:
            return U.fit_term(a, self.z[l])
        assert y is not None, "the last layer needs the labels"
        return U.last_layer_objective(a, self.z[l], y, self.params.nu)

    def _qu_layer(self, l: int) -> None:
        """q (then its grid projection) and u of layer l < L-1."""
        rho, nu = self.params.rho, self.params.nu
        p_next = self._p_next(l)
        q = U.update_q(p_next, self.u[l], self.z[l], rho, nu)
        self.q[l] = self._moved(q, self.q[l], "q" if l == self.hi - 1 else None)
        self.u[l] = U.update_u(self.u[l], p_next, self.q[l], rho)

    def layer_updates(self, y: Tensor | None) -> list[tuple[int, Callable[[], None]]]:
        """One Jacobi iteration as (layer, update) pairs in the order :meth:`step_p`,
        :meth:`step_wbz` and :meth:`step_qu` run them, so that a profiler can time each
        layer's share apart (``deepjimu.measure.compute``); run in order, under ``no_grad``,
        they are exactly those three phases."""
        out: list[tuple[int, Callable[[], None]]] = [
            (l, functools.partial(self._p_layer, l)) for l in self.layers if l > 0
        ]
        out += [(l, functools.partial(self._wbz_layer, l, y)) for l in self.layers]
        out += [(l, functools.partial(self._qu_layer, l)) for l in self.layers if l < self.L - 1]
        return out

    @torch.no_grad()
    def step_p(self) -> None:
        """p-subproblem of every owned layer l >= 1 (the operator's solve), then the grid."""
        for l in self.layers:
            if l > 0:
                self._p_layer(l)

    @torch.no_grad()
    def step_wbz(self, y: Tensor | None) -> None:
        """(W, b) jointly exact, then z, of every owned layer (with replicas, every layer's
        statistics pooled at once first: each layer's step needs only its own)."""
        parts: dict[int, U.WbStats] = {}
        if self.pooled is not None:
            full = self.others is None and not self.params.memory  # p_0 the whole data set's
            layers = [(self.ops[l], self.p[l], self.z[l], full and l == 0) for l in self.layers]
            parts = dict(zip(self.layers, pooled_stats_all(layers, self.pooled), strict=True))
        for l in self.layers:
            self._wbz_layer(l, y, parts.get(l))

    @torch.no_grad()
    def step_qu(self) -> None:
        """q (then its grid projection) and u of every owned layer l < L-1."""
        for l in self.layers:
            if l < self.L - 1:
                self._qu_layer(l)

    @torch.no_grad()
    def sweep_backward(self, y: Tensor | None) -> None:
        """One Gauss-Seidel sweep over the owned layers, last to first: q, u -> (W, b) -> z -> p.

        Every update is the same exact minimiser as in the Jacobi phases, but each layer uses
        the p that the layer above it has just updated (``p_right`` for the last owned layer:
        receive it first), so the labels' pull reaches every layer in one sweep instead of one
        layer per iteration. Across workers the sweep is a sequential chain, like the forward
        start; run it once after a start (``--admm-sweeps``), not every iteration.
        """
        for l in reversed(self.layers):
            if l < self.L - 1:
                self._qu_layer(l)
            self._wbz_layer(l, y)
            if l > 0:
                self._p_layer(l)

    @torch.no_grad()
    def commit_batch(self) -> None:
        """Mini-batch memory: add the finished batch's (p, z) to each layer's (W, b) statistics."""
        for l in self.layers:
            part = pooled_stats(self.ops[l], self.p[l], self.z[l], self.pooled)
            self.stats[l] = U.merge_stats(self.stats[l], part, self.params.memory)

    def sample_state(self) -> dict[str, Tensor]:
        """Every per-sample variable of the batch and its momentum record, by flat name.

        What ``--admm-aux keep`` stores between a batch's visits: p (not the data p_0), z,
        q, u and the boundary copies, with ``prev.`` in front for the momentum records.
        """
        out = _flat(self._iterate_state(), "")
        if self._prev is not None:
            out |= _flat(self._prev, "prev.")
        return out

    def load_sample_state(self, flat: dict[str, Tensor], p0: Tensor | None) -> None:
        """Restore :meth:`sample_state`; ``p0`` is the batch's data (layer 0's input, if owned).

        W, b and their momentum record stay as they are: they belong to every batch.
        """
        for k, v in _unflat(flat, "", self.layers).items():
            setattr(self, k, v)
        if p0 is not None:
            self.p[0] = p0
        self._data_gram = None
        if self._prev is not None:
            prev = _unflat(flat, "prev.", self.layers)
            self._prev = {"W": self._prev["W"], "b": self._prev["b"]} | {
                k: v for k, v in prev.items() if v is not None
            }

    def _iterate_state(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in ("W", "b", "z", "q", "u")}
        state["p"] = {l: t for l, t in self.p.items() if l > 0}  # p_0 is the data
        state |= {k: getattr(self, k) for k in _BOUNDARY_KEYS}
        return state

    @torch.no_grad()
    def extrapolate(self) -> None:
        """Momentum: every variable x but p becomes x + momentum (x - x_prev), after an iteration.

        p is left as it is: the next iteration starts with the p step, which overwrites it
        (a dense layer's exact minimiser does not read it; a conv layer's conjugate
        gradients start from it).

        The copies of the neighbours' boundary variables are treated as what they copy:
        q_left and u_left are extrapolated (both sides hold the same current and previous
        values, so they stay equal, and the distributed iterates equal the serial ones),
        p_right is not (it stays the p its owner holds). q is put back on the quantization
        grid. At 2 and 4 bits q and u (and their copies) are not extrapolated either: their
        last change carries the rounding of q's change, which extrapolation would amplify (on
        the MNIST subset at 2 bits, 89.3% test accuracy with, 92.9% without; BENCHMARKS.md
        section 7). The first call after an initialisation only records x.
        """
        beta = self.params.momentum
        skip = _NO_MOMENTUM + (_ROUNDED if per_row(self.params.bits) else ())
        current = {
            k: v for k, v in self._iterate_state().items() if k not in skip and v is not None
        }
        prev = self._prev
        if prev is None:
            self._prev = {k: _cloned(v) for k, v in current.items()}
            return
        # x becomes the record and the old record takes x + beta (x - x_prev) in place: the
        # records are the block's own (copies at first, then iterates that the steps have
        # since replaced by new tensors), so nothing else sees them change
        self._prev = {k: dict(v) if isinstance(v, dict) else v for k, v in current.items()}
        for k, v in current.items():
            grid = self._grid if k in ("p", "q", "q_left", "p_right") else (lambda t: t)
            if isinstance(v, dict):
                for l in v:
                    v[l] = grid(U.extrapolate_into(v[l], prev[k][l], beta))
            else:
                setattr(self, k, grid(U.extrapolate_into(v, prev[k], beta)))

    @torch.no_grad()
    def step_left_dual(self) -> None:
        """Keep u_{lo-1} in step with the left neighbour, from p_lo and the received q_{lo-1}.

        Both sides of the boundary hold p_lo and q_{lo-1} after the exchange and apply the same
        update to the same values, so u never has to be sent.
        """
        assert self.q_left is not None and self.u_left is not None
        self.u_left = U.update_u(self.u_left, self.p[self.lo], self.q_left, self.params.rho)

    # ---- the readout: the network that evaluation and checkpoints see ------------------------
    @property
    def readout_ridge(self) -> float:
        """The relative ridge of every readout refit: the run's, at least ``READOUT_RIDGE``."""
        return max(self.params.ridge, READOUT_RIDGE)

    @torch.no_grad()
    def readout_forward(
        self, plain: Tensor | None, refit: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """Carry the readout's forward passes through the owned layers (``driver.readout_chain``).

        pdADMM's auxiliary variables fit the labels better than the network's own forward
        pass does: each W was fitted to inputs p that the layers below only approximately
        produce. ``plain`` goes through the iterate's own (W, b). On ``refit``, each layer's
        (W, b) is first re-solved, then applied: the exact least squares (the operator's
        (W, b) step with tau = 0 and :attr:`readout_ridge`) from the input that the refitted
        layers below actually produce to this layer's target z_l. So the refitted network
        reproduces the iterate's z as closely as a forward pass can, one layer at a time.
        Hidden outputs go on the quantization grid, as the iterate's q do, so they cross a
        boundary exactly. Either input may be None (that pass is skipped).

        Keeps the refitted weights in ``refit_Wb`` and the plain input of the last layer in
        ``readout_features``. The iterate itself is not touched.

        Returns:
            the two outputs of the block (the logits where the block ends the network).
        """
        nu, ridge = self.params.nu, self.readout_ridge
        self.refit_Wb = {}
        for l in self.layers:
            op = self.ops[l]
            # what the last owned layer outputs crosses to the next block
            to_refit, to_plain = ("refit", "plain") if l == self.hi - 1 else (None, None)
            if l == self.L - 1:
                self.readout_features = plain
            if refit is not None:
                # refit of layer 0 is p_0, the data: its cached Gram (1-D) or statistics
                gram = self._gram_of_data() if l == 0 and self.pooled is None else None
                W, b = pooled_Wb(
                    op, refit, self.z[l], self.W[l], nu, self.pooled,
                    ridge=ridge, gram=gram, data=l == 0,
                )  # fmt: skip
                self.refit_Wb[l] = (W, b)
                refit = self.output(l, refit, W, b, crossing=to_refit)
            if plain is not None:
                plain = self.output(l, plain, self.W[l], self.b[l], crossing=to_plain)
        return plain, refit

    def output(
        self, l: int, p: Tensor, W: Tensor, b: Tensor, q: Tensor | None = None,
        crossing: str | None = None,
    ) -> Tensor:  # fmt: skip
        """Layer l's forward output for input p under (W, b): the logits for the last layer,
        else the ReLU of the pre-activation put on the quantization grid as q is: at 2 and 4
        bits q_l (the iterate's, or ``q``) plus the change on its grid, which the neighbour
        applies to its copy of q_l (``crossing``: as :meth:`_moved`'s)."""
        a = self.ops[l].forward(p, W, b)
        if l == self.L - 1:
            return a
        if not per_row(self.params.bits):
            return self._grid(torch.relu(a))
        return self._moved(torch.relu(a), self.q[l] if q is None else q, crossing)

    @torch.no_grad()
    def readout_choice(
        self, plain: Tensor | None, refit: Tensor | None, y: Tensor, mode: str
    ) -> str:
        """On the block that ends the network: the readout to use, after :meth:`readout_forward`.

        ``iterate``: the iterate's (W, b). ``last``: the classifier alone refitted, by the
        same least squares, on the features the iterate's own layers produce. ``all``: every
        layer refitted (:meth:`readout_forward`). ``auto``: of the three, the one whose
        forward pass has the lowest training loss (ties: the earlier one), so the readout
        never fits the training set worse than the iterate. Where the iterate's own forward
        pass ran (``plain``), its training loss and accuracy go to :attr:`iterate_fit`.
        """
        assert self.hi == self.L
        last, op = self.L - 1, self.ops[self.L - 1]
        logits: dict[str, Tensor] = {}
        self.iterate_fit = None
        if plain is not None:
            features = self.readout_features
            assert features is not None
            self.last_Wb = pooled_Wb(
                op, features, self.z[last], self.W[last], self.params.nu, self.pooled,
                ridge=self.readout_ridge,
            )  # fmt: skip
            logits |= {"iterate": plain, "last": op.forward(features, *self.last_Wb)}
        if refit is not None:
            logits["all"] = refit
        self.readout_features = None
        losses, accuracy = self._fits(logits, y)
        if plain is not None:
            self.iterate_fit = (losses["iterate"], accuracy)
        if mode != "auto":
            return mode
        return min(losses, key=lambda k: losses[k])

    def _fits(self, logits: dict[str, Tensor], y: Tensor) -> tuple[dict[str, float], float]:
        """Each readout's training loss, and the iterate's accuracy (0 where it did not run),
        over every replica's samples: with ``--replicas`` all in one all-reduce."""
        iterate = logits.get("iterate")
        if self.pooled is None:
            losses = {k: self.loss(v, y) for k, v in logits.items()}
            correct = float((iterate.argmax(1) == y).float().mean()) if iterate is not None else 0.0
            return losses, correct
        values = [F.cross_entropy(v, y, reduction="none") for v in logits.values()]
        if iterate is not None:
            values.append((iterate.argmax(1) == y).float())
        out = pooled_means(values, self.pooled)
        return dict(zip(logits, out, strict=False)), out[-1] if iterate is not None else 0.0

    def readout_weights(self, choice: str) -> dict[int, tuple[Tensor, Tensor]]:
        """The owned layers' (W, b) of the readout ``choice`` (see :meth:`readout_choice`)."""
        if choice == "all":
            return dict(self.refit_Wb)
        out = {l: (self.W[l], self.b[l]) for l in self.layers}
        if choice == "last" and self.hi == self.L:
            assert self.last_Wb is not None
            out[self.L - 1] = self.last_Wb
        return out

    # ---- what crosses a boundary ------------------------------------------------------------
    def message(self, name: str, value: Tensor) -> Tensor | Change:
        """What goes to a neighbour for ``value`` (``name``: as :attr:`sent`'s): the value, or
        at 2 and 4 bits the change that made it (taken: each change crosses once)."""
        return self.sent.pop(name) if per_row(self.params.bits) else value

    def first_p(self) -> Tensor:
        """p_lo, sent to the left neighbour."""
        return self.p[self.lo]

    def last_q(self) -> Tensor:
        """q_{hi-1}, sent to the right neighbour."""
        return self.q[self.hi - 1]

    # ---- diagnostics --------------------------------------------------------------------------
    @torch.no_grad()
    def objective_and_residual(self, y: Tensor | None) -> tuple[float, float]:
        """This block's share of the augmented Lagrangian and of ||p_{l+1} - q_l||^2.

        The link l -> l+1 is counted by the owner of layer l (it holds p_right for its last
        layer), so the shares of all blocks sum to the whole objective. A layer's terms that
        need its a = p W^T + b (a product as costly as the layer's share of an iteration) come
        from its last (W, b, z) step where that step kept them (:attr:`recording`), which
        holds while no variable of the layer has moved since (the caller's to ensure).
        """
        rho, nu = self.params.rho, self.params.nu
        obj, res = 0.0, 0.0
        kept, self._terms = self._terms, {}
        for l in self.layers:
            fit = kept[l] if l in kept else self._a_terms(l, self._a(l), y)
            if l == self.L - 1:
                obj += float(fit)
                continue
            terms = U.layer_terms(fit, self.z[l], self.q[l], self.u[l], self._p_next(l), rho, nu)
            obj += float(terms[0])
            res += float(terms[1])
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
        """Mean cross-entropy, as the gradient strategies report it (of every replica's samples)."""
        if self.pooled is None:
            return float(F.cross_entropy(logits, y))
        return pooled_mean(F.cross_entropy(logits, y, reduction="none"), self.pooled)

    # ---- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every variable and the step-size state, for a checkpoint (tensors moved to the CPU).

        Plain containers of tensors and numbers only, so ``torch.load(weights_only=True)``
        reads it back.
        """

        def cpu(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: cpu(x) for k, x in v.items()}
            return v.cpu() if isinstance(v, Tensor) else v

        variables = {k: getattr(self, k) for k in ("W", "b", "p", "z", "q", "u")}
        variables |= {k: getattr(self, k) for k in ("q_left", "u_left", "p_right")}
        return cpu(
            {
                **variables,
                "rho": self.params.rho,
                "nu": self.params.nu,
                "prev": self._prev,
                "counters": [self.zlast_hits, self.cg_iters, self.cg_solves, self.cg_hits],
                "stats": {l: None if st is None else vars(st) for l, st in self.stats.items()},
            }
        )

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Restore :meth:`state_dict` onto ``device``."""

        def to(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: to(x) for k, x in v.items()}
            return v.to(device) if isinstance(v, Tensor) else v

        for k in ("W", "b", "p", "z", "q", "u"):
            setattr(self, k, {int(i): v.to(device) for i, v in state[k].items()})
        for k in ("q_left", "u_left", "p_right"):
            setattr(self, k, None if state[k] is None else state[k].to(device))
        self._data_gram = None
        self.params.rho, self.params.nu = state["rho"], state["nu"]
        self._prev = to(state.get("prev"))
        counters = state.get("counters", [0, 0, 0, 0])
        self.zlast_hits, self.cg_iters, self.cg_solves, self.cg_hits = counters
        self.stats = {
            int(l): None if st is None else U.WbStats(**to(st))
            for l, st in state.get("stats", {}).items()
        } or {l: None for l in self.layers}


_BOUNDARY_KEYS = ("q_left", "u_left", "p_right")  # the copies of the neighbours' variables


def _cloned(v: Tensor | dict[int, Tensor]) -> Tensor | dict[int, Tensor]:
    return {l: t.clone() for l, t in v.items()} if isinstance(v, dict) else v.clone()


_NO_MOMENTUM = ("p", "p_right")  # read only after the p step has overwritten them
_ROUNDED = ("q", "q_left", "u", "u_left")  # at 2 and 4 bits: changes rounded to a coarse grid


def sample_nbytes(
    ops: Mapping[int, LayerOp],
    lo: int,
    hi: int,
    L: int,
    momentum: float,
    itemsize: int = 4,
    bits: int = 0,
) -> int:
    """Bytes per sample of the per-sample variables of the block of layers lo..hi-1 of L
    (:meth:`LayerBlock.sample_state`), known from the layer shapes before any exist.

    p of every layer but the first, z, q and u of every layer below the top (z alone at the
    top), the copies of the neighbours' boundary variables, and with momentum the record
    of the previous iterate (:meth:`LayerBlock.extrapolate`): all of it but p and its copy,
    and at 2 and 4 ``bits`` z alone (q, u and their copies are not extrapolated there).
    """
    ps, zs, qus = [], [], []
    for l in range(lo, hi):
        ps += [math.prod(ops[l].in_shape)] if l > 0 else []
        zs.append(math.prod(ops[l].out_shape))
        qus += [math.prod(ops[l].out_shape)] * (2 if l < L - 1 else 0)
    if lo > 0:  # q_left, u_left
        qus += [math.prod(ops[lo].in_shape)] * 2
    if hi < L:  # p_right
        ps.append(math.prod(ops[hi - 1].out_shape))
    recorded = (sum(zs) + (0 if per_row(bits) else sum(qus))) if momentum else 0
    return itemsize * (sum(ps) + sum(zs) + sum(qus) + recorded)


def _flat(state: dict[str, Any], prefix: str) -> dict[str, Tensor]:
    """The per-sample tensors of an iterate state (not W, b), named ``prefix`` + key (+ layer)."""
    out: dict[str, Tensor] = {}
    for k, v in state.items():
        if k in ("W", "b") or v is None:
            continue
        if isinstance(v, dict):
            out |= {f"{prefix}{k}{l}": t for l, t in v.items()}
        else:
            out[prefix + k] = v
    return out


def _unflat(flat: dict[str, Tensor], prefix: str, layers: range) -> dict[str, Any]:
    """The inverse of :func:`_flat`: per-layer dicts of p, z, q, u and the boundary copies (or None)."""
    out: dict[str, Any] = {k: flat.get(prefix + k) for k in _BOUNDARY_KEYS}
    for k in ("p", "z", "q", "u"):
        out[k] = {l: flat[f"{prefix}{k}{l}"] for l in layers if f"{prefix}{k}{l}" in flat}
    return out
