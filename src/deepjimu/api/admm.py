"""PdADMM: gradient-free pdADMM training of the user's own ``nn.Sequential``, in the user's loop.

The object drives the same engine as the ``admm`` strategy (:class:`~deepjimu.strategies.
admm.solver.Solver`: start, sweeps, iterations, momentum, readout, rho schedule) on the
same layers (:func:`~deepjimu.strategies.admm.model.admm_layers`, the one check of what
pdADMM trains), so a script that calls :meth:`PdADMM.step` N times computes what ``jimu
train --strategy admm --epochs N`` computes, MLPs and CNNs alike, and one that calls
:meth:`PdADMM.batch_step` over mini-batches computes ``--admm-batch B --admm-aux restart``;
it only leaves the loop, the data and the run folder to its user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from deepjimu.balance import parse_balance, partition
from deepjimu.bookkeeping import Bookkeeping
from deepjimu.comm import Comm, CommStats
from deepjimu.config import RunConfig
from deepjimu.data.tensors import as_labels, as_samples
from deepjimu.errors import JimuError
from deepjimu.options import AdmmGroup
from deepjimu.strategies.admm.blocks import (
    AdmmParams,
    LayerBlock,
    auto_defaults,
    auto_init,
    auto_inner,
    has_conv,
)
from deepjimu.strategies.admm.driver import Exchange
from deepjimu.strategies.admm.health import readout_failed, solve_failed
from deepjimu.strategies.admm.layers import LayerOp
from deepjimu.strategies.admm.model import admm_layers, admm_maps, new_block, write_weights
from deepjimu.strategies.admm.solver import Solver

__all__ = ["AdmmStep", "PdADMM", "admm_maps"]

_TRAIN = RunConfig()  # jimu train's defaults, which PdADMM's are


@dataclass(frozen=True)
class AdmmStep:
    """What one :meth:`PdADMM.step` (or :meth:`PdADMM.batch_step`) reports, summed over
    every block of the group.

    ``objective`` is the augmented Lagrangian (the loss term of the last layer plus every
    layer's equation and coupling terms); ``residual`` is the primal residual
    sqrt(sum_l ||p_{l+1} - q_l||^2), which must fall to 0 as the layers agree; ``readout``
    is the readout whose weights the model now holds (``iterate``, ``last`` or ``all``);
    ``rho`` the penalty the step ran with (``rho_growth`` may grow it for the next, as
    ``jimu train``'s events report it). After a full-batch step both figures are of the
    iterate the step's own updates made, before momentum extrapolates it; after a mini-batch,
    of that batch's variables as the visit left them.
    """

    iteration: int
    objective: float
    residual: float
    readout: str = "iterate"
    rho: float = 0.0


class PdADMM:
    """pdADMM (Wang et al., ICDM 2020) on the user's ``nn.Sequential``, one call per iteration.

    Full batch, as the paper: :meth:`init` starts every variable from a forward pass of
    ``model``'s weights on the samples ``x``, then each :meth:`step` runs one iteration
    (p -> (W, b) -> z -> q -> u for every layer) and writes the new weights back into
    ``model``: those of the ``readout`` of the new iterate, as ``jimu train`` evaluates and
    saves them. Or by mini-batches: each :meth:`batch_step` restarts the batch's variables
    from the current weights and runs ``inner`` iterations on it (``jimu train --admm-batch
    B --admm-aux restart``). MLPs and CNNs (conv layers, ReLU, non-overlapping average
    pooling; :func:`admm_maps`). Serial when ``group`` is None. Inside a torchrun (or any
    launcher) script, pass ``group`` (e.g. ``dist.group.WORLD``): each rank of the group owns
    a contiguous block of layers (``balance``: layers per rank; default: balanced by the
    estimated cost of each layer, as ``jimu train --strategy admm``), sends p to the left and
    q to the right each iteration, and writes back only its own layers; rank 0 alone needs
    ``x``, the last rank alone needs ``y``, the others may pass None.

    Every default is ``jimu train --strategy admm``'s: ``None`` takes the value it takes for
    the model's kind (``blocks.auto_defaults``: MLPs and CNNs differ), known at :meth:`init`.

    Args:
        model: ``[Conv2d, ReLU[, AvgPool2d], ...] [Flatten,] Linear, ReLU, ..., Linear``
            (:func:`admm_maps`), on the device the iterations run on.
        rho: penalty of the coupling p_{l+1} = q_l.
        nu: weight of the layer equations.
        bits: 0 (float32), 8 or 16 (every p and q on a quantization grid, exchanged as
            codes) or 4 or 2 (every change of p and q on a grid per sample, exchanged as
            packed codes).
        tau: proximal weight of each (W, b) step (larger: slower W).
        ridge: relative ridge of each (W, b) step (``updates.ridge_weight``).
        sweeps: backward Gauss-Seidel sweeps after each start, run by the first iteration
            after it (it brings the labels).
        momentum: extrapolate every variable by this fraction of its last change (0: off).
        init: ``forward`` (the model's weights), ``scaled`` (first rescale each layer to
            the first layer's pre-activation RMS on ``x``), ``unit`` (every hidden layer to
            unit-RMS activations, the function unchanged), ``identity`` (every square
            hidden-to-hidden dense layer the identity, then scaled) or ``auto`` (unit for
            CNNs, identity from ``blocks.DEEP_MLP`` layers, else forward).
        readout: the weights each :meth:`step` writes into ``model`` (``--admm-readout``):
            ``iterate`` (the iterate's own), ``last`` (the classifier refitted by exact least
            squares on the features the iterate's layers produce), ``all`` (every layer
            refitted, first to last) or ``auto`` (of the three, the lowest training loss).
            It never changes the iterate; it costs one more forward chain per step.
            Mini-batches write the iterate's (their variables last one visit).
        rho_growth: after each full-batch step, multiply rho by this when the primal
            residual has not fallen by 1% over the last 10 steps (``--rho-growth``; 1: off).
        inner: iterations per mini-batch (``--admm-inner``; None: 2 per layer, 4 for deep MLPs).
        memory: in mini-batch mode, the decay of the batches' (W, b) statistics (MLPs only;
            ``--admm-memory``).
        cg_iters: CG's iteration cap of every conv p-step (``--admm-cg-iters``).
        group: None (serial) or the process group whose ranks share the layers.
        balance: layers per rank of ``group``, e.g. ``[2, 1]``.

    Raises:
        ValueError: a model pdADMM does not train (naming the module), a bad value.

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
        ridge: float | None = None,
        sweeps: int | None = None,
        momentum: float | None = None,
        init: Literal["auto", "forward", "scaled", "unit", "identity"] = "auto",
        readout: Literal["auto", "iterate", "last", "all"] = "auto",
        rho_growth: float = _TRAIN.rho_growth,
        inner: int | None = None,
        memory: float | None = None,
        cg_iters: int = _TRAIN.admm_cg_iters,
        group: dist.ProcessGroup | None = None,
        balance: list[int] | None = None,
    ) -> None:
        self.maps = admm_maps(model)
        _check_values(rho=rho, nu=nu, bits=bits, tau=tau, ridge=ridge, sweeps=sweeps,
                      momentum=momentum, init=init, readout=readout, rho_growth=rho_growth,
                      inner=inner, memory=memory, cg_iters=cg_iters)  # fmt: skip
        self.model, self.group, self.init_mode, self.readout = model, group, init, readout
        self.given = {"ridge": ridge, "sweeps": sweeps, "momentum": momentum, "memory": memory}
        self.rho, self.nu, self.bits, self.tau = rho, nu, bits, tau
        self.rho_growth, self.inner, self.cg_iters = rho_growth, inner, cg_iters
        self.rank = dist.get_rank(group) if group is not None else 0
        self.world = dist.get_world_size(group) if group is not None else 1
        self.L = len(self.maps)
        self.sizes: list[int] | None = None
        if balance is not None:
            try:
                self.sizes = parse_balance(",".join(map(str, balance)), self.L, self.world)
            except JimuError as e:
                raise ValueError(str(e).replace("blocks", "layers")) from None
        elif self.world > self.L:
            raise ValueError(f"cannot cut {self.L} layers into {self.world} ranks")
        self.device = self.maps[0].weight.device
        self.conv = isinstance(self.maps[0], nn.Conv2d)
        # the messages of the iterations are counted, as a strategy's: stats.bytes_sent, ...
        self.stats = CommStats()
        self.exchange = Exchange(Comm(self.stats, group), bits, self.device)
        self.book = Bookkeeping(self.world, group)
        self.solver: Solver | None = None
        self.params: AdmmParams | None = None  # kept over restarts: rho may have grown
        self._mode = ""  # "full" after init, "batch" after batch_step
        self._x: Tensor | None = None
        self._n = 0

    @property
    def block(self) -> LayerBlock | None:
        """This rank's layers and variables (None before the first :meth:`init`)."""
        return self.solver.block if self.solver is not None else None

    @property
    def iteration(self) -> int:
        """Iterations run so far (every mini-batch's inner ones counted)."""
        return self.solver.iterations if self.solver is not None else 0

    # ---- the user's calls ----------------------------------------------------------------------
    def init(self, x: Tensor | np.ndarray | None) -> None:
        """Collective: start every variable from a forward pass of the model's weights on ``x``.

        Rank 0 of the group passes the samples (a batch of N rows, [N, C, H, W] for a CNN,
        flattened from dim 1 for an MLP: a tensor or a numpy array of any real dtype,
        computed in the model's), the others None; rank 0 sends their shape to the others,
        and each rank takes its block of layers (the partition of ``balance``, else of the
        estimated cost for N samples). Calling it again restarts from the model's current
        weights, on new samples.

        Raises:
            ValueError: ``x`` missing on rank 0, or of a shape the model does not take.
        """
        rows, shape = self._shared_samples(x)
        self._restart(rows, shape)
        self._mode = "full"

    def step(self, x: Tensor | np.ndarray | None, y: Tensor | np.ndarray | None) -> AdmmStep:
        """Collective: one full-batch pdADMM iteration, then the new weights written into the model.

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
        if self._mode != "full":
            if self._mode == "batch":
                raise ValueError("step(x, y) after batch_step: call init(x) first for full batch")
            self.init(x)
        elif self._other_samples(x):
            raise ValueError(
                "step(x, y) takes the samples given to init(x) (full-batch pdADMM); "
                "call init(x) first for new samples"
            )
        solver = self.solver
        assert solver is not None
        y = self._labels(y)
        self._solving(lambda: solver.iterate(y, measure=True))
        choice = self._readout(solver, y)
        self._write_back(choice)
        objective, residual = solver.objective_and_residual(y)
        rho = solver.block.params.rho
        solver.schedule(residual)  # for the next step
        return AdmmStep(solver.iterations, objective, residual, choice, rho)

    def batch_step(self, x: Tensor | np.ndarray | None, y: Tensor | np.ndarray | None) -> AdmmStep:
        """Collective: one visit of the mini-batch (``x``, ``y``), as ``jimu train --admm-batch
        B --admm-aux restart`` visits each: its variables start from a forward pass of the
        current weights, ``inner`` iterations update them, and the iterate's weights go into
        the model. Each (W, b) step keeps what earlier batches taught through its proximal
        term (and, with ``memory``, their statistics).

        Returns:
            the iterations so far, and the objective and residual of this batch's variables.

        Raises:
            ValueError: ``x`` (rank 0) or ``y`` (the last rank) missing or of the wrong shape.
            JimuError: a factorisation failed (nu / rho too large).
        """
        rows, shape = self._shared_samples(x)
        if self._mode != "batch":
            self._restart(rows, shape, batch=True)  # the partition, for this batch's size
            self._mode = "batch"
        solver = self.solver
        assert solver is not None
        y = self._labels(y)
        inner = self.inner or auto_inner(self.ops)
        self._solving(lambda: solver.restarted_batch(rows, y, shape[0], inner))
        self._write_back()
        objective, residual = solver.objective_and_residual(y)
        return AdmmStep(solver.iterations, objective, residual, "iterate", solver.block.params.rho)

    def gather(self) -> nn.Sequential:
        """Collective: every layer's weights from its owner into the model of every rank.

        A run of the ``admm`` strategy checkpoints each rank's own layers and gathers
        nothing; a script in a group wants the whole model on each of its ranks, so each
        owner broadcasts its layers over the group.

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
            for l, m in enumerate(self.maps):
                for t in (m.weight, m.bias):
                    assert t is not None
                    dist.broadcast(t.data, group=self.group, group_src=owner[l])
        return self.model

    def state_dict(self) -> dict[str, Any]:
        """This rank's variables (its block's W, b, p, z, q, u, rho), the rho schedule's
        history and the iteration count.

        Plain containers of tensors and numbers, so ``torch.load(weights_only=True)`` reads
        it back; in a group each rank saves its own.
        """
        if self.solver is None:
            raise ValueError("state_dict() before init(x): nothing to save yet")
        block = self.solver.block
        state = self.solver.state_dict()
        return state | {
            "iteration": self.solver.iterations,
            "layers": [block.lo, block.hi],
            "shape": list(self._shape),
            "mode": self._mode,
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
        self._setup(tuple(state["shape"]))
        solver = self._new_solver(lo, hi)
        solver.load_state_dict(state, self.device)
        self.params = solver.block.params
        self._mode = state["mode"]
        self._x = solver.block.p[0] if lo == 0 and self._mode == "full" else None
        self._n = int(state["shape"][0])
        self._write_back()

    # ---- internals -----------------------------------------------------------------------------
    def _rows(self, x: Tensor | np.ndarray) -> Tensor:
        """``x`` as the layers compute it: the model's dtype and device; flat rows for an MLP."""
        dtype = self.maps[0].weight.dtype
        rows = as_samples(x, "x", dtype).to(self.device)
        if self.conv and rows.dim() != 4:
            raise ValueError(
                f"a model that starts with a Conv2d takes samples [N, C, H, W] "
                f"(x: shape {list(rows.shape)})"
            )
        return rows if self.conv else rows.flatten(1)

    def _other_samples(self, x: Tensor | np.ndarray | None) -> bool:
        """Whether ``x`` (None: the ones already held) differs from the samples of :meth:`init`."""
        if x is None or x is self._x or self._x is None:
            return False
        return not torch.equal(self._rows(x), self._x)

    def _shared_samples(
        self, x: Tensor | np.ndarray | None
    ) -> tuple[Tensor | None, tuple[int, ...]]:
        """Collective: rank 0's samples as the layers take them, and their shape on every rank."""
        rows: Tensor | None = None
        if self.rank == 0:
            if x is None:
                raise ValueError("rank 0 owns the first layer: it needs the samples x")
            rows = self._rows(x)
        shape = self.book.broadcast_object(tuple(rows.shape) if rows is not None else None)
        return rows, tuple(shape)

    def _setup(self, shape: tuple[int, ...]) -> None:
        """The layers' operators for samples of ``shape`` (N first), and the iteration's
        settings (the model kind's defaults where not given)."""
        try:
            self.ops: list[LayerOp] = admm_layers(
                self.model, shape[1:], cg_max_iter=self.cg_iters, who="PdADMM"
            ).ops
        except JimuError as e:
            raise ValueError(f"{e} (samples of shape {list(shape[1:])})") from None
        if self.given["memory"] and has_conv(self.ops):
            raise ValueError("memory works on MLPs only, not on conv layers yet")
        self.settings = auto_defaults(self.ops, self.given)
        self._shape = shape

    def _restart(self, rows: Tensor | None, shape: tuple[int, ...], batch: bool = False) -> None:
        """Collective: a new block of layers from the model's current weights, partitioned by
        the cost of ``shape[0]`` samples, started on ``rows`` (unless ``batch``: a batch
        starts itself)."""
        self._setup(shape)
        n = shape[0]
        costs = [op.flops(n, with_p=l > 0) for l, op in enumerate(self.ops)]
        sizes = self.sizes or partition(costs, self.world)
        lo = sum(sizes[: self.rank])
        solver = self._new_solver(lo, lo + sizes[self.rank], batch)
        if not batch:
            self._solving(lambda: solver.start(rows, n))
            self._write_back()
        self._x, self._n = rows, n

    def _new_solver(self, lo: int, hi: int, batch: bool = False) -> Solver:
        """Layers lo..hi-1 from the model's current weights, and the solver that drives them;
        a scaled or unit start rescales the weights at the first start only."""
        if self.params is None:
            self.params = AdmmParams.of(self.rho, self.nu, self.bits, self.tau, self.settings)
        self.params.memory = float(self.settings["memory"]) if batch else 0.0
        block = new_block(self.maps, self.ops, lo, hi, self.params)
        mode = auto_init(self.ops) if self.init_mode == "auto" else self.init_mode
        first = self.solver is None
        solver = Solver(
            block, self.exchange, self.rank, self.world, self.book,
            sweeps=int(self.settings["sweeps"]), init=mode if first else "forward",
            rho_growth=1.0 if batch else self.rho_growth,
        )  # fmt: skip
        if not first:  # the count and the schedule go on
            assert self.solver is not None
            solver.iterations, solver.history = self.solver.iterations, self.solver.history
        self.solver = solver
        return solver

    def _labels(self, y: Tensor | np.ndarray | None) -> Tensor | None:
        """``y`` as class indices on the device for the rank that owns the last layer; None elsewhere."""
        assert self.solver is not None
        if not self.solver.last:
            return None
        if y is None:
            raise ValueError(f"rank {self.rank} owns the last layer: it needs y, the labels")
        labels = as_labels(y).to(self.device)
        outputs = self.maps[-1].weight.shape[0]
        if len(labels) and int(labels.max()) >= outputs:
            raise ValueError(
                f"labels go up to {int(labels.max())}, the model has {outputs} outputs: "
                f"class indices must be below the last Linear's out_features"
            )
        return labels

    def _solving(self, run: Any) -> None:
        """``run()``, a factorisation's failure as one line."""
        assert self.solver is not None
        try:
            run()
        except torch.linalg.LinAlgError as e:  # the p and W solves factorise
            params = self.solver.block.params
            raise JimuError(solve_failed(e, self.iteration + 1, params.rho, params.nu)) from None

    def _readout(self, solver: Solver, y: Tensor | None) -> str:
        """Collective: the readout of the new iterate (the strategy's, ``Solver.readout``)."""
        try:
            choice, _ = solver.readout(self._x, y, self._n, self.readout)
        except torch.linalg.LinAlgError as e:
            raise JimuError(readout_failed(e, "readout='iterate'")) from None
        return choice

    def _write_back(self, choice: str = "iterate") -> None:
        assert self.solver is not None
        write_weights(self.maps, self.solver.block.readout_weights(choice))


# PdADMM's keywords and the jimu train options (AdmmGroup) they are
_KEYWORDS = {
    "quantize": "bits",
    "admm_tau": "tau",
    "admm_ridge": "ridge",
    "admm_sweeps": "sweeps",
    "admm_momentum": "momentum",
    "admm_init": "init",
    "admm_readout": "readout",
    "rho_growth": "rho_growth",
    "admm_memory": "memory",
    "admm_cg_iters": "cg_iters",
}


def _check_values(**v: Any) -> None:
    """Each keyword's range, in one line naming it: ``jimu train``'s checks of its flag
    (:meth:`AdmmGroup.problems`), in the keywords' words. ``inner`` is None for the model
    kind's count, where the flag says 0."""
    if v["inner"] is not None and v["inner"] < 1:
        raise ValueError(f"inner must be >= 1 (inner: {v['inner']})")
    options = {k: v[word] for k, word in _KEYWORDS.items()}
    problems = AdmmGroup(rho=v["rho"], nu=v["nu"], admm_inner=v["inner"] or 0, **options).problems()
    if problems:
        line = problems[0]
        for option, word in _KEYWORDS.items():  # whole flags only: rho-growth is not rho
            line = re.sub(rf"(?<![\w-]){option.replace('_', '-')}(?![\w-])", word, line)
        raise ValueError(line)
