"""Defaults per data family: the table, and the order in which every default of a run is chosen.

An option's value comes from the first of these that has one, applied by one function,
:func:`deepjimu.validation.resolve_defaults`:

1. the user: a flag, a key of the ``--config`` TOML file, a ``deepjimu.fit`` keyword
   (with ``--resume``: also every value that the run's ``config.json`` saved);
2. the family table, for the family of ``--dataset`` (its registry entry names it):
   the strategy's own rows (its registry entry's ``family_defaults``) over the family's
   row for every strategy (:data:`FAMILY_DEFAULTS`);
3. the model kind: admm's ``None = auto`` options (``--admm-ridge``, ``--admm-momentum``,
   ``--admm-sweeps``, ``--admm-memory``) stay ``auto`` in the config, and are chosen by
   one function where the model's layers are known, for ``jimu train`` and ``PdADMM``
   alike (:func:`deepjimu.strategies.admm.blocks.auto_defaults`): whether the user gave one
   decides other choices (``--admm-aux auto``);
4. the strategy (``--workers``, ``--epochs``: its registry entry's traits; ``--lr``: the
   optimizer's, :data:`DEFAULT_LR`), else the option's own default (``jimu train --help``).

The table applies only to options that apply to the run, that the user did not give and
that still hold their own default; the CLI prints what it set (``defaults for graph data:
...``) and the run's ``config.json`` records the values, so a resumed run keeps them. No
torch import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deepjimu.choices import Family, Optimizer

__all__ = ["DEFAULT_LR", "FAMILY_DEFAULTS", "describe", "help_text", "table_defaults"]

# family -> option (RunConfig field name) -> value, for every strategy (a strategy's own
# rows are its registry entry's). Empty rows keep each family at the options' own defaults.
FAMILY_DEFAULTS: dict[Family, dict[str, Any]] = {
    Family.IMAGES: {},
    Family.TABULAR: {},
    # chosen on Cora's validation split only (issue 27; BENCHMARKS.md section 11, "Defaults
    # for graph data"): 140 labelled nodes are fewer than the 1,433 inputs, so one hidden
    # layer; the gradient strategies GCN's published Planetoid settings (lr 1e-3 had not
    # learnt in 100 epochs at 2 steps an epoch)
    Family.GRAPH: {"model": "mlp:256x1", "epochs": 200, "lr": 0.01, "weight_decay": 5e-4},
    # nanoGPT's character-level GPT on a CPU (its README and train_shakespeare_char config:
    # batch 12, context 64, lr 1e-3, 2,000 iterations, 100 of warm-up, cosine decay to 1e-4)
    Family.TEXT: {
        "model": "gpt:4x128:4",
        "batch_size": 12,
        "lr": 1e-3,
        "steps": 2000,
        "lr_schedule": "cosine",
        "warmup_steps": 100,
    },
    Family.TENSORS: {},  # the caller's own data: its kind is unknown
}

DEFAULT_LR = {Optimizer.ADAM: 1e-3, Optimizer.SGD: 0.05, Optimizer.KFAC: 0.05}
"""``--lr`` per ``--optimizer``, when it is not given."""

StrategyRows = Mapping[Family, Mapping[str, Any]]
"""A strategy's own rows of the table: family -> option -> value."""


def table_defaults(family: Family, own: StrategyRows | None = None) -> dict[str, Any]:
    """The table's values for ``family``: its row for every strategy, then the strategy's
    ``own`` row.

    Example:
        >>> table_defaults(Family.GRAPH, {Family.GRAPH: {"epochs": 50}})["epochs"]
        50
    """
    return {**FAMILY_DEFAULTS.get(family, {}), **(own or {}).get(family, {})}


def help_text(option: str, strategies: Mapping[str, StrategyRows]) -> str:
    """The table's values of ``option`` for its ``--help``, e.g. ``graph data with admm: 50``
    ("" where the table leaves it alone), so that the help stays true as the table fills;
    ``strategies``: each strategy's own rows, by name."""
    parts = []
    for family, row in FAMILY_DEFAULTS.items():
        if option in row:
            parts.append(f"{family.noun} data: {row[option]}")
        for name, rows in strategies.items():
            if option in rows.get(family, {}):
                parts.append(f"{family.noun} data with {name}: {rows[family][option]}")
    return ", ".join(parts)


def describe(family: Family, chosen: dict[str, Any]) -> str:
    """The start-up line naming what the table set.

    Example:
        >>> describe(Family.GRAPH, {"model": "mlp:256x2", "epochs": 50})
        'defaults for graph data: model mlp:256x2, epochs 50'
    """
    items = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in chosen.items())
    return f"defaults for {family.noun} data: {items}"
