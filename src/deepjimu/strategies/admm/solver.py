"""The pdADMM engine: one rank's block of layers and every step of its solve, whoever drives it.

``jimu train --strategy admm`` (:class:`~deepjimu.strategies.admm.strategy.AdmmStrategy`:
epochs, events, checkpoints, mini-batches kept on disk) and :class:`deepjimu.PdADMM` (the
user's own loop) both drive a :class:`Solver`, so a script that steps one computes what
``jimu train`` computes: the same start, sweeps, iterations, momentum, readout and rho
schedule, in the same order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from torch import Tensor

from deepjimu.bookkeeping import Bookkeeping
from deepjimu.strategies.admm.blocks import LayerBlock
from deepjimu.strategies.admm.driver import (
    Exchange,
    backward_sweep,
    choose_readout,
    distributed_iteration,
    init_blocks_forward,
    serial_iteration,
)

__all__ = ["Readout", "Solver"]

Readout = Callable[[str], "str | None"]
"""Runs the readout ``mode`` of the current iterate over the chain and returns the choice on
the last rank (None elsewhere); :func:`driver.choose_readout` by default, the kept
mini-batches' streamed :func:`kept.kept_readout` in ``jimu train``."""


class Solver:
    """pdADMM on one rank of a chain of ranks: its :class:`LayerBlock` and what it exchanges.

    Every method that says *collective* is called by every rank of the chain at the same
    point. The iterate lives in ``block``; the solver adds what the iterations around it
    need: the start's one-off rescaling, the backward sweeps due after a start (run by the
    next :meth:`iterate`, which brings the labels), momentum, the readout, the rho schedule
    and the iteration count.

    Args:
        block: this rank's layers and variables.
        exchange: the p/q messages to the neighbours (``exchange.comm`` counts them).
        rank, world: this rank's place in the chain and the chain's length.
        book: the uncounted object collectives of the chain (the readout's choice, the
            objective's shares).
        sweeps: backward Gauss-Seidel sweeps after every start.
        init: ``forward`` (the weights as they are), ``scaled`` or ``unit`` (rescaled once,
            at the first start: :meth:`LayerBlock.init_forward`), or ``identity`` (the square
            hidden layers made the identity, :meth:`LayerBlock.identity_start`, then scaled).
        rho_growth: the factor :meth:`schedule` grows rho by when the residual stalls (1: off).
    """

    def __init__(
        self,
        block: LayerBlock,
        exchange: Exchange,
        rank: int,
        world: int,
        book: Bookkeeping,
        *,
        sweeps: int,
        init: str = "forward",
        rho_growth: float = 1.0,
    ) -> None:
        self.block, self.exchange, self.rank, self.world, self.book = (
            block, exchange, rank, world, book,
        )  # fmt: skip
        self.sweeps = sweeps
        self.rho_growth = rho_growth
        self._rescale, self._unit = init in ("scaled", "unit", "identity"), init == "unit"
        self._identity = init == "identity"
        self._sweeps_due = 0
        # the objective and residual shares an iterate(measure=True) took, until reported,
        # and the clock they are taken on (the strategy's: Run.aside, evaluation time)
        self._measured: tuple[float, float] | None = None
        self.aside: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        self.iterations = 0
        self.history: list[float] = []  # the residuals at each schedule check since rho grew

    @property
    def last(self) -> bool:
        """Whether this rank owns the last layer (and needs the labels)."""
        return self.block.hi == self.block.L

    def start(self, x: Tensor | None, n_samples: int) -> None:
        """Collective: every variable from one forward pass on ``x`` (rank 0's; None elsewhere)
        of ``n_samples`` rows; the first start sets and rescales the weights if ``init`` asks.
        The next :meth:`iterate` first runs the backward sweeps."""
        if self._identity:
            self.block.identity_start()
        init_blocks_forward(
            self.block, x, n_samples, self.exchange, self.rank, self.world, self._rescale,
            self._unit,
        )  # fmt: skip
        self._rescale = self._identity = False
        self._sweeps_due, self._measured = self.sweeps, None

    def iterate(self, y: Tensor | None, measure: bool = False) -> None:
        """Collective: the sweeps due after a start, then one iteration (p -> (W, b) -> z ->
        q -> u on every layer, the neighbours' previous iterate exchanged), then momentum.

        ``measure``: take this block's share of the objective and residual of the iterate
        the iteration made, before momentum moves it, for the next
        :meth:`objective_and_residual` to report. Nearly free here: each (W, b, z) step keeps
        its layer's terms from the a = p W^T + b it computes anyway, where measuring later
        multiplies again (on 5 x 500 and 10,000 rows, a third of an iteration).

        Raises:
            torch.linalg.LinAlgError: a p or (W, b) factorisation failed.
        """
        for _ in range(self._sweeps_due):
            backward_sweep(self.block, y, self.exchange, self.rank, self.world)
        self._sweeps_due = 0
        self.block.recording, self._measured = self.aside if measure else None, None
        try:
            if self.world == 1:
                assert y is not None
                serial_iteration(self.block, y)
            else:
                distributed_iteration(self.block, y, self.exchange, self.rank, self.world)
        finally:
            self.block.recording = None
        if measure:
            with self.aside():
                self._measured = self.block.objective_and_residual(y)
        if self.block.params.momentum:
            self.block.extrapolate()
        self.iterations += 1

    def restarted_batch(self, x: Tensor | None, y: Tensor | None, n: int, inner: int) -> None:
        """Collective: one visit of a mini-batch whose auxiliary variables live for it alone:
        a start on its ``n`` rows, ``inner`` iterations, then (``params.memory``) its (W, b)
        statistics committed for the next batches."""
        self.start(x, n)
        for _ in range(inner):
            self.iterate(y)
        if self.block.params.memory:
            self.block.commit_batch()

    def readout(
        self,
        x: Tensor | None,
        y: Tensor | None,
        n_samples: int,
        mode: str,
        run_readout: Readout | None = None,
    ) -> tuple[str, tuple[float, float] | None]:
        """Collective: the readout ``mode`` (``iterate``, ``last``, ``all``, ``auto``) of the
        current iterate, as every rank then knows it, and the iterate's own (training loss,
        accuracy) where the readout's forward pass measured it.

        Raises:
            torch.linalg.LinAlgError: a refit's least squares failed.
        """
        if mode == "iterate":
            return mode, None
        if run_readout is None:

            def run_readout(m: str) -> str | None:
                return choose_readout(
                    self.block, x, y, n_samples, self.exchange, self.rank, self.world, m
                )

        choice = run_readout(mode)
        fit = self.block.iterate_fit if self.last else None
        # known once the chain has reached the last rank: the others wait for it there
        return self.book.broadcast_object((choice, fit), src=self.world - 1)

    def objective_and_residual(self, y: Tensor | None) -> tuple[float, float]:
        """Collective: the augmented Lagrangian and the primal residual
        sqrt(sum_l ||p_{l+1} - q_l||^2) of the whole chain (uncounted bookkeeping): of the
        iterate that the last :meth:`iterate` made if it measured, else of the current one."""
        share, self._measured = self._measured, None
        shares = self.book.gather_objects(
            share if share is not None else self.block.objective_and_residual(y)
        )
        return sum(s[0] for s in shares), sum(s[1] for s in shares) ** 0.5

    def schedule(self, residual: float) -> bool:
        """Grow rho by ``rho_growth`` when the primal residual has not fallen by 1% over the
        last 10 checks; returns whether it grew."""
        if self.rho_growth <= 1:
            return False
        self.history.append(residual)
        if len(self.history) > 10 and residual > 0.99 * min(self.history[-11:-1]):
            self.block.params.rho *= self.rho_growth
            self.history.clear()
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """The block's variables (with rho), the schedule's history and the iteration count."""
        return {
            "block": self.block.state_dict(),
            "history": list(self.history),
            "iterations": self.iterations,
        }

    def load_state_dict(self, state: dict[str, Any], device: Any) -> None:
        """Restore :meth:`state_dict`; the weights keep their scale at any later start."""
        self.block.load_state_dict(state["block"], device)
        self.history = list(state.get("history", []))
        self.iterations = int(state.get("iterations", 0))
        self._rescale = self._identity = False
