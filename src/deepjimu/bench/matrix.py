"""The bench matrix: which (strategy, workers, model) cells to run, and which are impossible."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass

from deepjimu.config import ConfigErrors, RunConfig, validate
from deepjimu.errors import JimuError

__all__ = ["BENCH_FLAGS", "Cell", "parse_list", "parse_workers", "plan", "train_config"]

# flags the bench sets itself for every run; --train-args must not repeat them
BENCH_FLAGS = (
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
)


@dataclass(frozen=True)
class Cell:
    """One configuration of the matrix.

    ``skip`` is the reason this combination cannot run (e.g. ``local`` with 2 workers),
    or None when it is to be run.
    """

    strategy: str
    workers: int
    model: str
    skip: str | None = None

    @property
    def name(self) -> str:
        """The run folder name, e.g. ``ddp-w2-mlp-256x3``."""
        return f"{self.strategy}-w{self.workers}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', self.model)}"

    @property
    def label(self) -> str:
        """A short label for tables and plots, e.g. ``ddp x2 mlp:256x3``."""
        return f"{self.strategy} x{self.workers} {self.model}"


def parse_list(text: str, option: str) -> list[str]:
    """A comma list of names, e.g. ``local,ddp`` (duplicates dropped, order kept).

    Raises:
        JimuError: the list is empty.
    """
    items = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not items:
        raise JimuError(f"--{option} must name at least one item (got {text!r})")
    return items


def parse_workers(text: str) -> list[int]:
    """A comma list of worker counts >= 1, e.g. ``1,2,3``.

    Raises:
        JimuError: an item is not a positive integer.
    """
    out = []
    for item in parse_list(text, "workers"):
        if not item.isdigit() or int(item) < 1:
            raise JimuError(f"--workers must be positive integers (got {item!r} in {text!r})")
        out.append(int(item))
    return list(dict.fromkeys(out))


def train_config(train_args: str, base: dict[str, object]) -> tuple[RunConfig, list[str]]:
    """The RunConfig that ``jimu train <train_args>`` would build, with ``base`` fields set.

    Args:
        train_args: extra ``jimu train`` flags, one shell string (e.g. ``"--microbatches 8"``).
        base: RunConfig fields the bench controls (dataset, seed, ...).

    Returns:
        the config (not yet validated) and the split flag list to pass to every run.

    Raises:
        JimuError: the flags do not parse, or repeat a flag the bench sets itself.
    """
    from deepjimu.cli import build_parser, config_from_args

    try:
        argv = shlex.split(train_args)
    except ValueError as e:
        raise JimuError(
            f"--train-args cannot be split into flags: {e} (got {train_args!r})"
        ) from None
    args = build_parser().parse_args(["train", *argv])
    clash = sorted(k for k in vars(args) if k in BENCH_FLAGS)
    if clash:
        flags = ", ".join("--" + k.replace("_", "-") for k in clash)
        raise JimuError(
            f"--train-args must not set {flags}: the bench sets it (got {train_args!r})"
        )
    cfg = config_from_args(args)
    return dataclasses.replace(cfg, **base), argv  # type: ignore[arg-type]


def _skip_reason(cfg: RunConfig) -> str | None:
    """Why ``cfg`` cannot run with its worker count, or None.

    A combination is impossible when its config is valid with the strategy's default
    worker count but not with this one (``local`` with 2 workers, more stages than blocks).
    Any other problem is a failure of the run, which the run itself will report.
    """
    try:
        validate(cfg)
        return None
    except ConfigErrors as e:
        here = e.problems
    except Exception:  # e.g. a strategy module that does not import: the run will say so
        return None
    try:
        validate(dataclasses.replace(cfg, workers=None))
    except Exception:
        return None
    return "; ".join(here)


def plan(
    base: RunConfig, strategies: list[str], workers: list[int], models: list[str]
) -> list[Cell]:
    """Every cell of strategies x workers x models, in that nesting order, with skip reasons.

    Example:
        >>> [c.label for c in plan(RunConfig(), ["local"], [1, 2], ["mlp:16x1"]) if c.skip]
        ['local x2 mlp:16x1']
    """
    cells = []
    for strategy in strategies:
        for model in models:
            for w in workers:
                cfg = dataclasses.replace(base, strategy=strategy, workers=w, model=model)
                cells.append(Cell(strategy, w, model, _skip_reason(cfg)))
    return cells
