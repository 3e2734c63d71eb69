"""Defaults per data family: the one table, and the order in which every default of a run is chosen.

An option's value comes from the first of these that has one:

1. the user: a flag, a key of the ``--config`` TOML file, a ``deepjimu.fit`` keyword
   (with ``--resume``: also every value that the run's ``config.json`` saved);
2. this table, for the family of ``--dataset`` (its registry entry names it) and the
   strategy: the strategy's row over the family's ``ALL`` row;
3. the model kind (admm's ``None = auto`` options ``--admm-ridge``, ``--admm-momentum``,
   ``--admm-sweeps``, ``--admm-memory``: ``strategies/admm/blocks.py``, ``auto_defaults``);
4. the strategy (``--workers``, ``--epochs``: its class attributes; ``--lr``: the
   optimizer's, ``config.DEFAULT_LR``), else the option's own default (``jimu train --help``).

:func:`deepjimu.validation.validate` applies the table (only options that apply to the
run, that the user did not give and that still hold their own default), the CLI prints
what it set (``defaults for graph data: ...``) and the run's ``config.json`` records the
values, so a resumed run keeps them. No torch import here.
"""

from __future__ import annotations

from typing import Any

from deepjimu.choices import Family

__all__ = ["ALL", "FAMILY_DEFAULTS", "describe", "help_text", "table_defaults"]

ALL = "*"
"""The row of a family that holds for every strategy."""

# family -> strategy (or ALL) -> option (RunConfig field name) -> value.
# Empty rows keep each family at the options' own defaults.
FAMILY_DEFAULTS: dict[Family, dict[str, dict[str, Any]]] = {
    Family.IMAGES: {},
    Family.TABULAR: {},
    # chosen on Cora's validation split only (issue 27; BENCHMARKS.md section 11, "Defaults
    # for graph data"): 140 labelled nodes are fewer than the 1,433 inputs, so one hidden
    # layer, and admm a ridge of 1 (the middle of what held on Cora's random splits and on
    # label-scarce sbm graphs); the gradient strategies GCN's published Planetoid settings
    # (lr 1e-3 had not learnt in 100 epochs at 2 steps an epoch)
    Family.GRAPH: {
        ALL: {"model": "mlp:256x1", "epochs": 200, "lr": 0.01, "weight_decay": 5e-4},
        "admm": {"model": "mlp:256x1", "epochs": 50, "admm_ridge": 1.0},
    },
    Family.TENSORS: {},  # the caller's own data: its kind is unknown
}


def table_defaults(family: Family, strategy: str) -> dict[str, Any]:
    """The table's values for ``family`` and ``strategy``: its ``ALL`` row, then its own.

    Example:
        >>> table_defaults(Family.TABULAR, "local")
        {}
    """
    rows = FAMILY_DEFAULTS.get(family, {})
    return {**rows.get(ALL, {}), **rows.get(strategy, {})}


def help_text(option: str) -> str:
    """The table's values of ``option`` for its ``--help``, e.g. ``graph data with admm: 50``
    ("" where the table leaves it alone), so that the help stays true as the table fills."""
    parts = []
    for family, rows in FAMILY_DEFAULTS.items():
        for strategy, row in rows.items():
            if option in row:
                who = f"{family.noun} data" + ("" if strategy == ALL else f" with {strategy}")
                parts.append(f"{who}: {row[option]}")
    return ", ".join(parts)


def describe(family: Family, chosen: dict[str, Any]) -> str:
    """The start-up line naming what the table set.

    Example:
        >>> describe(Family.GRAPH, {"model": "mlp:256x2", "epochs": 50})
        'defaults for graph data: model mlp:256x2, epochs 50'
    """
    items = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in chosen.items())
    return f"defaults for {family.noun} data: {items}"
