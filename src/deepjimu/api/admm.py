"""PdADMM: gradient-free pdADMM training of the user's own ``nn.Sequential`` MLP, in the user's loop.

The object owns the same math objects as the ``admm`` strategy (:class:`LayerBlock`,
:class:`AdmmParams`, :class:`Exchange`, the drivers' iterations and the cost partition), so a
script that calls :meth:`PdADMM.step` N times computes what ``jimu train --strategy admm
--epochs N`` computes; it only leaves the loop, the data and the run folder to its user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from deepjimu.comm import Comm, CommStats
from deepjimu.config import RunConfig
from deepjimu.data.tensors import as_labels, as_samples
from deepjimu.errors import JimuError
from deepjimu.strategies.admm.blocks import MLP_DEFAULTS, AdmmParams, LayerBlock, auto_init
from deepjimu.strategies.admm.driver import (
    Exchange,
    backward_sweep,
    choose_readout,
    distributed_iteration,
    init_blocks_forward,
    serial_iteration,
)
from deepjimu.strategies.admm.health import readout_failed, solve_failed
from deepjimu.strategies.admm.layers import DenseOp
from deepjimu.strategies.admm.model import admm_linears
from deepjimu.strategies.partition import parse_balance, partition

__all__ = ["AdmmStep", "PdADMM", "admm_linears"]

_TRAIN = RunConfig()  # jimu train's defaults, which PdADMM's are


@dataclass(frozen=True)
class AdmmStep:
    """What one :meth:`PdADMM.step` reports, summed over every block of the group.

    ``objective`` is the augmented Lagrangian (the loss term of the last layer plus every
    layer's equation and coupling terms); ``residual`` is the primal residual
    sqrt(sum_l ||p_{l+1} - q_l||^2), which must fall to 0 as the layers agree; ``readout``
    is the readout whose weights the model now holds (``iterate``, ``last`` or ``all``).
    """

    iteration: int
    objective: float
    residual: float
    readout: str = "iterate"


class PdADMM:
    """pdADMM (Wang et al., ICDM 2020) on the user's ``nn.Sequential`` MLP, one call per iteration.

    Full batch, as the paper: :meth:`init` starts every variable from a forward pass of
    ``model``'s weights on the samples ``x``, then each :meth:`step` runs one iteration
    (p -> (W, b) -> z -> q -> u for every layer) and writes the new weights back into
    ``model``: those of the ``readout`` of the new iterate, as ``jimu train`` evaluates and
    saves them. Serial when ``group`` is None. Inside a torchrun (or any launcher) script,
    pass ``group`` (e.g. ``dist.group.WORLD``): each rank of the group owns a contiguous
    block of layers (``balance``: layers per rank; default: balanced by the estimated cost
    of each layer, as ``jimu train --strategy admm``), sends p to the left and q to the
    right each iteration, and writes back only its own layers; rank 0 alone needs ``x``,
    the last rank alone needs ``y``, the others may pass None.

    The defaults of ``rho``, ``nu``, ``bits``, ``tau`` and of the MLP options below are
    ``jimu train --strategy admm``'s.

    Args:
        model: ``[Flatten,] Linear, ReLU, ..., Linear`` (see :func:`admm_linears`), on the
            device the iterations run on. CNNs train with ``jimu train --strategy admm
            --model cnn:C1-C2-...``.
        rho: penalty of the coupling p_{l+1} = q_l.
        nu: weight of the layer equations.
        bits: 0 (float32), 8 or 16: every p and q on a quantization grid, exchanged as codes.
        tau: proximal weight of each (W, b) step (larger: slower W).
        ridge: relative ridge of each (W, b) step (``updates.ridge_weight``; default
            ``blocks.MLP_DEFAULTS``, as ``jimu train``).
        sweeps: backward Gauss-Seidel sweeps after each :meth:`init`, run by the first
            :meth:`step` after it (it brings the labels; default as ``jimu train``).
        momentum: extrapolate every variable by this fraction of its last change (0: off;
            default as ``jimu train`` for MLPs).
        init: ``forward`` (the model's weights), ``scaled`` (first rescale each layer to
            the first layer's pre-activation RMS on ``x``) or ``auto`` (scaled from
            ``blocks.SCALED_FROM_DEPTH`` layers, as ``jimu train``).
        readout: the weights each step writes into ``model`` (``--admm-readout``):
            ``iterate`` (the iterate's own), ``last`` (the classifier refitted by exact least
            squares on the features the iterate's layers produce), ``all`` (every layer
            refitted, first to last, on the input the refitted layers below produce) or
            ``auto`` (of the three, the lowest training loss; default, as ``jimu train``).
            It never changes the iterate; it costs one more forward chain per step.
        group: None (serial) or the process group whose ranks share the layers.
        balance: layers per rank of ``group``, e.g. ``[2, 1]``.

    Raises:
        ValueError: a model that is not such an MLP (naming the module), a bad value.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> admm = PdADMM(model, rho=1.0, nu=1.0)
        >>> x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
        >>> admm.init(x)
        >>> result = admm.step(x, y)  # model now holds the new weights
    """

    def __init__(
        self,
        model: nn.Sequential,
        rho: float = _TRAIN.rho,
        nu: float = _TRAIN.nu,
        bits: int = _TRAIN.quantize,
        *,
        tau: float = _TRAIN.admm_tau,
        ridge: float = float(MLP_DEFAULTS["ridge"]),
        sweeps: int = int(MLP_DEFAULTS["sweeps"]),
        momentum: float = float(MLP_DEFAULTS["momentum"]),
        init: Literal["auto", "forward", "scaled"] = "auto",
        readout: Literal["auto", "iterate", "last", "all"] = "auto",
        group: dist.ProcessGroup | None = None,
        balance: list[int] | None = None,
    ) -> None:
        self.linears = admm_linears(model)
        for name, v in (("rho", rho), ("nu", nu)):
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive number ({name}: {v})")
        if bits not in (0, 8, 16):
            raise ValueError(f"bits must be 0, 8 or 16 (bits: {bits})")
        if not (tau >= 0 and math.isfinite(tau)):
            raise ValueError(f"tau must be a number >= 0 (tau: {tau})")
        if not (ridge >= 0 and math.isfinite(ridge)):
            raise ValueError(f"ridge must be a number >= 0 (ridge: {ridge})")
        if sweeps < 0:
            raise ValueError(f"sweeps must be >= 0 (sweeps: {sweeps})")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1) (momentum: {momentum})")
        if init not in ("auto", "forward", "scaled"):
            raise ValueError(f"init must be auto, forward or scaled (init: {init!r})")
        if readout not in ("auto", "iterate", "last", "all"):
            raise ValueError(f"readout must be auto, iterate, last or all (readout: {readout!r})")
        self.readout = readout
        self.model, self.group, self.init_mode = model, group, init
        self.rank = dist.get_rank(group) if group is not None else 0
        self.world = dist.get_world_size(group) if group is not None else 1
        self.L = len(self.linears)
        self.widths = [self.linears[0].in_features] + [m.out_features for m in self.linears]
        self.sizes: list[int] | None = None
        if balance is not None:
            try:
                self.sizes = parse_balance(",".join(map(str, balance)), self.L, self.world)
            except JimuError as e:
                raise ValueError(str(e).replace("blocks", "layers")) from None
        elif self.world > self.L:
            raise ValueError(f"cannot cut {self.L} layers into {self.world} ranks")
        self.device = self.linears[0].weight.device
        self.params = AdmmParams(rho=rho, nu=nu, bits=bits, tau=tau, ridge=ridge, momentum=momentum)
        self.sweeps, self._sweeps_due = sweeps, 0
        # the messages of the iterations are counted, as a strategy's: stats.bytes_sent, ...
        self.stats = CommStats()
        self.exchange = Exchange(Comm(self.stats, group), bits, self.device)
        self.block: LayerBlock | None = None
        self.iteration = 0
        self._x: Tensor | None = None
        self._n = 0

    # ---- the user's calls ----------------------------------------------------------------------
    def init(self, x: Tensor | np.ndarray | None) -> None:
        """Collective: start every variable from a forward pass of the model's weights on ``x``.

        Rank 0 of the group passes the samples (a batch of N rows, flattened from dim 1: a
        tensor or a numpy array of any real dtype, computed in the model's), the others
        None; rank 0 sends N to the others, and each rank takes its block of layers (the
        partition of ``balance``, else of the estimated cost for N samples).
        Calling it again restarts from the model's current weights, on new samples.

        Raises:
            ValueError: ``x`` missing on rank 0, or its features do not fit the first Linear.
        """
        rows: Tensor | None = None
        if self.rank == 0:
            if x is None:
                raise ValueError("rank 0 owns the first layer: init(x) needs the samples x")
            rows = self._samples(x)
            if rows.shape[1] != self.widths[0]:
                raise ValueError(
                    f"x has {rows.shape[1]} features per sample, the first Linear takes {self.widths[0]}"
                )
        n = torch.tensor([len(rows) if rows is not None else 0])
        if self.group is not None:
            dist.broadcast(n, group=self.group, group_src=0)
        n_samples = int(n.item())
        # the strategy's balance: each layer's flops per iteration (layers.DenseOp.flops)
        ops = [
            DenseOp((n_in,), n_out)
            for n_in, n_out in zip(self.widths[:-1], self.widths[1:], strict=True)
        ]
        costs = [op.flops(n_samples, with_p=l > 0) for l, op in enumerate(ops)]
        sizes = self.sizes or partition(costs, self.world)
        lo = sum(sizes[: self.rank])
        hi = lo + sizes[self.rank]
        # a scaled start rescales the weights once, at the first init, as the strategy does
        mode = auto_init(ops) if self.init_mode == "auto" else self.init_mode
        scale = mode == "scaled" and self.block is None
        self.block = self._new_block(lo, hi)
        init_blocks_forward(
            self.block, rows, n_samples, self.exchange, self.rank, self.world, scale
        )
        self._sweeps_due = self.sweeps
        self._x, self._n = rows, n_samples
        self._write_back()

    def step(self, x: Tensor | np.ndarray | None, y: Tensor | np.ndarray | None) -> AdmmStep:
        """Collective: one pdADMM iteration, then the new weights written into the model.

        Args:
            x: the samples given to :meth:`init` (rank 0; others may pass None). A first
                call without :meth:`init` initialises from ``x``.
            y: the labels, class indices [N] of any integer dtype, below the model's outputs
                (the last rank; others may pass None).

        Returns:
            the iteration count, the objective and the primal residual of the whole group.

        Raises:
            ValueError: ``y`` missing on the last rank or not class indices below the
                model's outputs, or ``x`` other than the samples of :meth:`init` (full-batch
                pdADMM: call :meth:`init` for new samples).
            JimuError: a factorisation failed (nu / rho too large).
        """
        if self.block is None:
            self.init(x)
        elif (
            x is not None
            and x is not self._x
            and self._x is not None
            and not torch.equal(self._samples(x), self._x)
        ):
            raise ValueError(
                "step(x, y) takes the samples given to init(x) (full-batch pdADMM); "
                "call init(x) first for new samples"
            )
        block = self.block
        assert block is not None
        if block.hi == self.L:
            if y is None:
                raise ValueError(f"rank {self.rank} owns the last layer: step(x, y) needs y")
            y = as_labels(y).to(self.device)
            if len(y) and int(y.max()) >= self.widths[-1]:
                raise ValueError(
                    f"labels go up to {int(y.max())}, the model has {self.widths[-1]} outputs: "
                    f"class indices must be below the last Linear's out_features"
                )
        else:
            y = None
        try:
            for _ in range(self._sweeps_due):  # the strategy sweeps right after its start
                backward_sweep(block, y, self.exchange, self.rank, self.world)
            self._sweeps_due = 0
            if self.world == 1:
                assert y is not None
                serial_iteration(block, y)
            else:
                distributed_iteration(block, y, self.exchange, self.rank, self.world)
        except torch.linalg.LinAlgError as e:  # the p and W solves factorise
            raise JimuError(
                solve_failed(e, self.iteration + 1, self.params.rho, self.params.nu)
            ) from None
        if self.params.momentum:
            block.extrapolate()
        self.iteration += 1
        choice = self._readout(block, y)
        self._write_back(choice)
        objective, residual = block.objective_and_residual(y)
        if self.group is not None:
            # bookkeeping, as the strategy's gathered shares: not counted in stats
            shares = torch.tensor([objective, residual], dtype=torch.float64)
            dist.all_reduce(shares, group=self.group)
            objective, residual = shares.tolist()
        return AdmmStep(self.iteration, objective, math.sqrt(residual), choice)

    def gather(self) -> nn.Sequential:
        """Collective: every layer's weights from its owner into the model of every rank.

        :func:`deepjimu.strategies.partition.gather_model` needs a :class:`~deepjimu.run.Run`
        and collects on global rank 0 only; a script in a group wants the whole model on
        each of its ranks, so each owner broadcasts its layers over the group.

        Returns:
            the model, whole on every rank.
        """
        if self.group is None or self.block is None:
            return self.model
        bounds = [torch.zeros(2, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(bounds, torch.tensor([self.block.lo, self.block.hi]), group=self.group)
        owner = {
            l: r for r, (lo, hi) in enumerate(t.tolist() for t in bounds) for l in range(lo, hi)
        }
        with torch.no_grad():
            for l, m in enumerate(self.linears):
                for t in (m.weight, m.bias):
                    dist.broadcast(t.data, group=self.group, group_src=owner[l])
        return self.model

    def state_dict(self) -> dict[str, Any]:
        """This rank's variables (its block's W, b, p, z, q, u, rho) and the iteration count.

        Plain containers of tensors and numbers, so ``torch.load(weights_only=True)`` reads
        it back; in a group each rank saves its own.
        """
        if self.block is None:
            raise ValueError("state_dict() before init(x): nothing to save yet")
        return {
            "iteration": self.iteration,
            "layers": [self.block.lo, self.block.hi],
            "block": self.block.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (of this rank), writing the iterate's weights into the model.

        The readout needs the labels, so the next :meth:`step` writes its weights again.

        Raises:
            ValueError: the state is of other layers than this rank's.
        """
        lo, hi = state["layers"]
        if not 0 <= lo < hi <= self.L:
            raise ValueError(f"state of layers {lo}..{hi - 1} does not fit a {self.L}-layer model")
        self.block = self._new_block(lo, hi)
        self.block.load_state_dict(state["block"], self.device)
        self.iteration = int(state["iteration"])
        self._x = self.block.p[0] if lo == 0 else None
        self._n = len(self.block.z[lo])
        self._write_back()

    # ---- internals -----------------------------------------------------------------------------
    def _samples(self, x: Tensor | np.ndarray) -> Tensor:
        """``x`` as the layers compute it: the model's dtype and device, flat rows."""
        dtype = self.linears[0].weight.dtype
        return as_samples(x, "x", dtype).to(self.device).flatten(1)

    def _new_block(self, lo: int, hi: int) -> LayerBlock:
        """Layers lo..hi-1, starting from the model's current weights."""
        W = [self.linears[l].weight.detach().clone() for l in range(lo, hi)]
        b = [self.linears[l].bias.detach().clone() for l in range(lo, hi)]
        return LayerBlock(lo, hi, self.L, W, b, self.params)

    def _readout(self, block: LayerBlock, y: Tensor | None) -> str:
        """Collective: the readout of the new iterate (the strategy's, ``driver.choose_readout``)."""
        try:
            choice = choose_readout(
                block, self._x, y, self._n, self.exchange, self.rank, self.world, self.readout
            )
        except torch.linalg.LinAlgError as e:
            raise JimuError(readout_failed(e, "readout='iterate'")) from None
        if self.group is not None and self.readout != "iterate":
            box = [choice]
            dist.broadcast_object_list(box, group=self.group, group_src=self.world - 1)
            choice = box[0]
        assert choice is not None
        return choice

    def _write_back(self, choice: str = "iterate") -> None:
        assert self.block is not None
        weights = self.block.readout_weights(choice)
        with torch.no_grad():
            for l in self.block.layers:
                W, b = weights[l]
                self.linears[l].weight.copy_(W)
                self.linears[l].bias.copy_(b)
