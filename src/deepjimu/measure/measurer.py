"""This machine as a strategy's measurer: what a strategy needs measured, at the moment it asks, through its ``Run``.

The worker hands every :class:`~deepjimu.run.Run` a :class:`ThisMachine`; the strategies
call it through ``run.measurer`` and never import this package (torchgpipe's ``balance``
hands ``GPipe`` a plain list the same way). Every method is collective where it says so:
every rank calls it at the same point, so the order of collectives is the strategy's own.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from deepjimu.compress.sync import SyncExecutor
from deepjimu.cost.probe import Probe
from deepjimu.cost.sync import SyncPlan, SyncTrial
from deepjimu.data import DataSplits
from deepjimu.measure.blocks import block_times
from deepjimu.measure.probe import measure
from deepjimu.measure.sync import make_plan, trial_steps
from deepjimu.options import DdpOptions
from deepjimu.run import Run

__all__ = ["ThisMachine"]


class ThisMachine:
    """:class:`~deepjimu.run.Measurer` of the machine the run is on.

    Example:
        >>> import torch
        >>> costs = ThisMachine().block_costs(nn.Sequential(nn.Linear(4, 2)), torch.zeros(8, 4))
        >>> len(costs)
        1
    """

    def probe(self, model: nn.Sequential, data: DataSplits, cfg: DdpOptions, run: Run) -> Probe:
        """Collective: the link and this device for ``model`` (:func:`deepjimu.measure.probe.measure`)."""
        return measure(model, data, cfg, run)

    def sync_plan(
        self,
        model: nn.Module,
        batches: Sequence[tuple[Tensor, Tensor]],
        rows: int,
        plan: str,
        run: Run,
    ) -> SyncPlan:
        """Collective: ddp's ``--sync-plan`` of ``model`` over the run's group
        (:func:`deepjimu.measure.sync.make_plan`)."""
        return make_plan(model, batches, rows, plan, run.device)

    def sync_trial(
        self,
        model: nn.Module,
        ddp: nn.Module,
        executor: SyncExecutor,
        batches: Sequence[tuple[Tensor, Tensor]],
        run: Run,
    ) -> SyncTrial:
        """Collective: ``executor``'s plan and torch's DDP stepped alternately
        (:func:`deepjimu.measure.sync.trial_steps`)."""
        return trial_steps(model, ddp, executor, batches, run.device)

    def block_costs(self, model: nn.Sequential, sample: Tensor, repeats: int = 3) -> list[float]:
        """Forward + backward seconds of each block on ``sample``, the median of ``repeats``
        after a warm-up, on a copy of ``model`` under a forked RNG (so that measuring
        changes neither the weights nor what training does afterwards)."""
        return block_times(model, sample, repeats).costs()
