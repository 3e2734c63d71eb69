"""The option groups together: the compositions the strategies take, the order of ``--help``, the checks between groups.

Each group is a frozen dataclass that declares its options (help, choices, where each
applies: :mod:`deepjimu.applies`) and checks its own values (:meth:`Group.problems`;
:mod:`~deepjimu.options.run`, :mod:`~deepjimu.options.gradient`,
:mod:`~deepjimu.options.admm`). The groups are the only place an option is written down:
:class:`~deepjimu.config.RunConfig` is all of them together; the CLI's flags come out of
them, each group a section of ``--help``; a TOML file's table (``[admm]``) holds the
options of the group of that name.

A strategy's registry entry names the composition of groups it takes
(``AdmmOptions(AdmmGroup, RunGroup)``, defined below, next to each other so that one screen
shows the compositions), and the strategy is handed only those (:func:`narrow`): it cannot
read an option of a group it did not declare, and an option of a group applies only to the
strategies that take it (:func:`applies_of`). No torch import here: ``--help`` is built
before torch loads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from deepjimu.applies import Applies, Takers
from deepjimu.choices import Optimizer
from deepjimu.options.admm import AdmmGroup
from deepjimu.options.base import Group
from deepjimu.options.gradient import KfacGroup, OptimGroup, PipelineGroup, SyncGroup
from deepjimu.options.run import DataGroup, RunGroup

__all__ = [
    "GROUPS",
    "AdmmOptions",
    "DdpOptions",
    "GradientOptions",
    "LocalOptions",
    "PipelineOptions",
    "applies_of",
    "between_groups",
    "group_of",
    "kfac_worker_problems",
]


# what each strategy takes: the groups it declares, composed (its ``options``)
@dataclass(frozen=True)
class GradientOptions(OptimGroup, RunGroup):
    """What every gradient strategy takes (model-parallel: no more): the run's and the optimiser's."""


@dataclass(frozen=True)
class LocalOptions(KfacGroup, GradientOptions):
    """What local takes: the run's, the optimiser's and K-FAC's options."""


@dataclass(frozen=True)
class DdpOptions(SyncGroup, KfacGroup, GradientOptions):
    """What ddp takes: the run's, the optimiser's, K-FAC's and the gradient sync's options."""


@dataclass(frozen=True)
class PipelineOptions(PipelineGroup, GradientOptions):
    """What pipeline takes: the run's, the optimiser's and the schedule's options."""


@dataclass(frozen=True)
class AdmmOptions(AdmmGroup, RunGroup):
    """What admm takes: the run's options and pdADMM's own."""


GROUPS: tuple[type[Group], ...] = (
    RunGroup,
    DataGroup,
    OptimGroup,
    PipelineGroup,
    AdmmGroup,
    KfacGroup,
    SyncGroup,
)
"""Every option group, in the order of ``--help`` and of a run's saved options."""


def applies_of(name: str) -> Applies:
    """Where option ``name`` applies: its own declaration, within the strategies that take
    its group when it names none itself and the group is not universal (an admm option
    applies to the strategies that take the admm group, by construction).

    Raises:
        KeyError: no group declares it.
    """
    group = group_of(name)
    own: Applies = next(f for f in group.options() if f.name == name).metadata["applies"]
    if own.strategies or group.universal:
        return own
    return dataclasses.replace(own, strategies=Takers(group=group))


def group_of(name: str) -> type[Group]:
    """The group that declares option ``name``.

    Raises:
        KeyError: no group declares it.
    """
    for group in GROUPS:
        if any(f.name == name for f in group.options()):
            return group
    raise KeyError(name)


def between_groups(cfg: Any) -> list[str]:
    """The checks between groups, one line each: what the optimiser group allows of the ddp
    sync group (K-FAC and sync plans replace the gradient all-reduce where the compressors
    and local SGD live), and K-FAC's gradient workers against the run's workers (once
    those are resolved)."""
    problems = []
    if cfg.optimizer == Optimizer.KFAC and (cfg.compress != "none" or cfg.local_sgd):
        problems.append(
            "optimizer kfac runs with plain gradient all-reduce: drop --compress and --local-sgd "
            f"(compress: {cfg.compress}, local-sgd: {cfg.local_sgd})"
        )
    # a sync plan other than allreduce replaces DDP's buckets and comm hook, where the
    # compressors, local SGD and K-FAC's factor traffic live
    if cfg.sync_plan != "allreduce" and (
        cfg.compress != "none" or cfg.local_sgd or cfg.optimizer == Optimizer.KFAC
    ):
        problems.append(
            f"sync-plan {cfg.sync_plan} synchronises each tensor its own way and does not combine "
            "with --compress, --local-sgd or --optimizer kfac: drop them or use --sync-plan "
            f"allreduce (compress: {cfg.compress}, local-sgd: {cfg.local_sgd}, optimizer: "
            f"{cfg.optimizer})"
        )
    if cfg.optimizer == Optimizer.KFAC and cfg.workers is not None and cfg.workers >= 1:
        problems.extend(kfac_worker_problems(cfg.kfac_grad_workers, cfg.workers))
    if cfg.optimizer == Optimizer.KFAC and str(cfg.model).strip().lower().startswith("gpt"):
        # its factors are those of a Linear on rows of features, or a conv on images; a
        # transformer's Linear layers see (batch, time, width) and its attention has none
        problems.append(
            f"optimizer kfac preconditions the Linear and conv layers of mlp and cnn models; "
            f"model {cfg.model} is a transformer (use --optimizer adam or sgd)"
        )
    return problems


def kfac_worker_problems(fraction: float, workers: int) -> list[str]:
    """``--kfac-grad-workers F`` must be in [1/workers, 1] and F x workers a divisor of workers.

    F x workers ranks precondition each layer (KAISA's gradient workers; rounded to a whole
    number within 0.05, so that 0.33 means 1 of 3); the ranks form a grid with that many
    rows, so it must divide the worker count.
    """
    count = fraction * workers
    if not (math.isfinite(count) and 0.95 <= count <= workers + 0.05):
        return [
            f"kfac-grad-workers must be in [1/workers, 1] = [{1 / workers:.4g}, 1] "
            f"(kfac-grad-workers: {fraction}, workers: {workers})"
        ]
    if abs(count - round(count)) > 0.05 or workers % round(count):
        return [
            f"kfac-grad-workers times workers must be a whole divisor of workers "
            f"(kfac-grad-workers: {fraction}, workers: {workers}, product: {count:.4g})"
        ]
    return []
