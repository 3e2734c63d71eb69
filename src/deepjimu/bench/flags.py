"""What a bench (and a plan) takes besides ``jimu train``'s options: the options it sets per configuration, the matrix's defaults, the train flags given to it.

Light, no torch import: the CLI's ``--help`` is built from it.
"""

from __future__ import annotations

import argparse
import re

from deepjimu.config import coerce, field_kind, option_fields
from deepjimu.strategies.registry import strategy_names

__all__ = ["BENCH_FLAGS", "MATRIX_DEFAULTS", "Options", "option_argv", "slug", "train_flags"]

MATRIX_DEFAULTS = {
    "strategies": ",".join(strategy_names()),
    "workers": "1,2,3",
    "models": "mlp:256x3",
}
"""The matrix of ``jimu bench`` and ``jimu plan`` where not given: every strategy, 1-3
workers, one model."""

# flags the bench sets itself for every run; --train-args must not repeat them
BENCH_FLAGS = frozenset(
    {
        "strategy",
        "workers",
        "model",
        "dataset",
        "data_dir",
        "seed",
        "epochs",
        "name",
        "runs_dir",
        "quiet",
        "resume",
    }
)

Options = tuple[tuple[str, str], ...]
"""Varied ``jimu train`` options of a cell, as (field name, value text) pairs."""


def slug(text: str) -> str:
    """``text`` with every run of characters a folder name should not hold as one ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def option_argv(options: Options) -> list[str]:
    """``jimu train`` flags for ``options``, e.g. ``(("lr", "0.01"),)`` -> ``["--lr", "0.01"]``.

    A boolean option's text is ``true`` or ``false`` (``--quiet`` / ``--no-quiet``).
    """
    kinds = {f.name: field_kind(f) for f in option_fields()}
    argv = []
    for name, value in options:
        flag = name.replace("_", "-")
        if kinds[name] == "bool":
            argv.append(f"--{flag}" if coerce(name, value, "flag") else f"--no-{flag}")
        else:
            argv += [f"--{flag}", value]
    return argv


def train_flags(args: argparse.Namespace) -> dict[str, str]:
    """The ``jimu train`` options given to the bench, as text (booleans ``true`` / ``false``)."""
    kinds = {f.name: field_kind(f) for f in option_fields() if f.name not in BENCH_FLAGS}
    return {
        k: (str(v).lower() if kinds[k] == "bool" else str(v))
        for k, v in vars(args).items()
        if k in kinds
    }
