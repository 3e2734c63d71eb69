"""``jimu bench --tune``: the same number of trials for every strategy, chosen on the validation split.

Each strategy says what it tunes and where (``Strategy.tune_space``: the learning rate on a
log grid for the gradient strategies, rho and nu for admm). The bench gives every
(strategy, model, options) group the same number of trials, each a real ``jimu train`` run
with the group's smallest worker count, and keeps the setting whose final validation
accuracy is highest (ties: the one nearest the default, which comes first). Test figures
are only ever read from the runs made afterwards with the chosen setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deepjimu.bench.matrix import Cell, Options
from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.options import narrow
from deepjimu.strategies import get_strategy
from deepjimu.strategies.registry import entry

__all__ = ["Trial", "Tuning", "format_value", "tune_group", "tuned_keys"]


@dataclass
class Trial:
    """One tuning run: its setting, how it ended and its final validation accuracy."""

    setting: Options
    status: str
    val_acc: float | None = None
    error: str = ""


@dataclass
class Tuning:
    """The trials of one (strategy, model, options) group and the setting chosen."""

    strategy: str
    model: str
    options: Options
    workers: int
    trials: list[Trial] = field(default_factory=list)

    @property
    def choice(self) -> Options:
        """The best trial's setting (ties: the earliest, nearest the default); () if none ran."""
        done = [t for t in self.trials if t.val_acc is not None]
        if not done:
            return ()
        return max(done, key=lambda t: t.val_acc or 0.0).setting  # max keeps the first of ties


def format_value(v: Any) -> str:
    """A tuned value as flag text, short and exact enough to repeat (``0.000316228``)."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def tuned_keys(strategies: Sequence[str], base: RunConfig, trials: int) -> set[str]:
    """Every option that ``--tune`` sets for these strategies (they must not be given)."""
    keys: set[str] = set()
    for s in strategies:
        try:
            space = get_strategy(s).tune_space(
                narrow(dataclasses.replace(base, strategy=s), entry(s).options), trials
            )
        except JimuError:
            continue  # an unknown strategy: the matrix plan names it, one line per configuration
        for setting in space:
            keys |= set(setting)
    return keys


def tune_group(
    cells: Sequence[Cell],
    base: RunConfig,
    trials: int,
    run_trial: Callable[[Cell, Options], tuple[str, str, float | None]],
) -> Tuning | None:
    """Tune the runnable ``cells`` of one group; None when none can run.

    Args:
        cells: the group's cells (same strategy, model and options), skipped ones included.
        base: the bench's base config (for the strategy's defaults).
        trials: the number of trials.
        run_trial: runs ``cell`` with the extra options; returns (status, error, val_acc).
    """
    runnable = [c for c in cells if not c.skip]
    if not runnable:
        return None
    cell = min(runnable, key=lambda c: c.workers)
    tuning = Tuning(cell.strategy, cell.model, cell.options, cell.workers)
    try:
        cfg = dataclasses.replace(base, strategy=cell.strategy, model=cell.model)
        own = narrow(cfg, entry(cell.strategy).options)
        space = get_strategy(cell.strategy).tune_space(own, trials)
    except JimuError as e:
        tuning.trials.append(Trial((), "failed", None, str(e)))
        return tuning
    for setting in space:
        options = tuple((k, format_value(v)) for k, v in setting.items())
        status, error, val_acc = run_trial(cell, options)
        tuning.trials.append(Trial(options, status, val_acc, error))
    return tuning
