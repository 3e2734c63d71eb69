"""The bench matrix: which (strategy, workers, model, options) cells to run, and which are impossible."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from deepjimu.bench.flags import BENCH_FLAGS, Options, option_argv, slug
from deepjimu.config import (
    ConfigErrors,
    RunConfig,
    coerce,
    field_kind,
    flag_values,
    given_options,
    load_config,
    option_fields,
)
from deepjimu.errors import JimuError
from deepjimu.flags import add_options
from deepjimu.strategies.registry import strategy_names
from deepjimu.validation import does_not_apply, validate

__all__ = [
    "Cell",
    "parse_list",
    "parse_workers",
    "plan",
    "split_variants",
    "train_config",
]


@dataclass(frozen=True)
class Cell:
    """One configuration of the matrix.

    ``options`` are the varied ``jimu train`` options of this cell (e.g. ``lr=0.01``);
    ``dropped`` the bench's fixed options that do not apply to it (``--lr`` for admm),
    left out of its run; ``skip`` is the reason this combination cannot run (e.g.
    ``local`` with 2 workers), or None when it is to be run.
    """

    strategy: str
    workers: int
    model: str
    options: Options = ()
    skip: str | None = None
    dropped: tuple[str, ...] = ()

    def argv(self, fixed: Options, more: Options = ()) -> list[str]:
        """The ``jimu train`` flags of this cell's run: the bench's ``fixed`` options that
        apply to it, its own options, then ``more`` (a tuned setting)."""
        kept = tuple((k, v) for k, v in fixed if k not in self.dropped)
        return option_argv(kept + self.options + more)

    @property
    def name(self) -> str:
        """The run folder name, e.g. ``ddp-w2-mlp-256x3`` or ``ddp-w2-mlp-256x3-lr0.01``."""
        opts = "".join(f"-{k.replace('_', '-')}{slug(v)}" for k, v in self.options)
        return f"{self.strategy}-w{self.workers}-{slug(self.model)}{opts}"

    @property
    def label(self) -> str:
        """A short label for tables and plots, e.g. ``ddp x2 mlp:256x3 lr=0.01``."""
        opts = "".join(f" {k.replace('_', '-')}={v}" for k, v in self.options)
        return f"{self.strategy} x{self.workers} {self.model}{opts}"

    @property
    def group(self) -> tuple[str, str, Options]:
        """What the cells of one speedup series (and one tuning) share."""
        return (self.strategy, self.model, self.options)


def parse_list(text: str, option: str) -> list[str]:
    """A comma list of names, e.g. ``local,ddp`` (duplicates dropped, order kept).

    Raises:
        JimuError: the list is empty, or has an empty item (``1,,2``: likely a typo).
    """
    items = [s.strip() for s in text.split(",")]
    if not any(items):
        raise JimuError(f"--{option} must name at least one item (got {text!r})")
    if not all(items):
        raise JimuError(f"--{option} has an empty item (got {text!r})")
    return list(dict.fromkeys(items))


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


def split_variants(flags: Mapping[str, str]) -> tuple[Options, list[Options]]:
    """Split ``jimu train`` flag values into fixed options and the matrix of varied ones.

    A comma-separated value of an option that holds one value (``--lr 1e-3,3e-3``,
    ``--precision fp32,bf16``) is a matrix dimension; list options (``--classes 0,1``) and
    options whose values contain commas (``--balance 2,2``) are fixed.

    Args:
        flags: field name -> value text as given on the command line (booleans as
            ``true`` / ``false``).

    Returns:
        (fixed options, every combination of the varied ones; ``[()]`` when none varies).

    Raises:
        ConfigErrors: a value does not fit its option's type (one line each).

    Example:
        >>> split_variants({"lr": "0.1,0.2", "batch_size": "32"})
        ((('batch_size', '32'),), [(('lr', '0.1'),), (('lr', '0.2'),)])
    """
    fields = {f.name: f for f in option_fields()}
    fixed: list[tuple[str, str]] = []
    varied: list[list[tuple[str, str]]] = []
    problems = []
    for name, text in flags.items():
        f = fields[name]
        one_value = field_kind(f) != "list[int]" and not f.metadata.get("commas")
        values = parse_list(text, name.replace("_", "-")) if one_value else [text]
        for v in values:
            try:
                coerce(name, v, "flag")
            except JimuError as e:
                problems.append(str(e))
        if len(values) > 1:
            varied.append([(name, v) for v in values])
        else:
            fixed.append((name, values[0]))
    if problems:
        raise ConfigErrors(problems)
    return tuple(fixed), [tuple(combo) for combo in itertools.product(*varied)]


def _train_parser() -> argparse.ArgumentParser:
    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # one line, no usage text
            raise JimuError(f"--train-args: {message}")

    p = Parser(prog="jimu train", add_help=False)
    add_options(p)
    return p


def train_options(train_argv: Sequence[str]) -> Options:
    """The options that ``jimu train <train_argv>`` sets, as (field name, value text) pairs.

    Raises:
        JimuError: the flags do not parse, or repeat a flag the bench sets itself.
    """
    args = _train_parser().parse_args(list(train_argv))
    clash = sorted(k for k in vars(args) if k in BENCH_FLAGS)
    if clash:
        flags = ", ".join("--" + k.replace("_", "-") for k in clash)
        raise JimuError(
            f"--train-args must not set {flags}: the bench sets it (got {shlex.join(train_argv)!r})"
        )
    text = {True: "true", False: "false"}
    return tuple((k, text[v] if isinstance(v, bool) else str(v)) for k, v in vars(args).items())


def train_config(fixed: Options, base: dict[str, object]) -> RunConfig:
    """The RunConfig of the bench's ``fixed`` ``jimu train`` options, with ``base`` fields set.

    Args:
        fixed: options as (field name, value text) pairs (:func:`train_options`).
        base: RunConfig fields the bench controls (dataset, seed, ...).

    Returns:
        the config (not yet validated).

    Raises:
        JimuError: a value of the wrong type.
    """
    typed = flag_values(argparse.Namespace(**dict(fixed)))
    return dataclasses.replace(load_config(typed), **base)  # type: ignore[arg-type]


def _problems(cfg: RunConfig) -> list[str] | None:
    """What ``jimu train`` would refuse in ``cfg`` (the same validation); None when it is valid."""
    try:
        validate(cfg)
    except ConfigErrors as e:
        return e.problems
    except Exception:  # e.g. a strategy module that does not import: the run will say so
        return None
    return None


def plan(
    base: RunConfig,
    strategies: Sequence[str],
    workers: Sequence[int],
    models: Sequence[str],
    variants: Sequence[Options] = ((),),
    fixed: Sequence[str] | None = None,
) -> list[Cell]:
    """Every cell of strategies x models x variants x workers, in that nesting order, with skips.

    ``fixed`` names the options the bench gives every run (default: those of ``base`` that
    differ from their defaults).

    Every cell's config is validated as ``jimu train`` validates it, before anything runs.
    A cell is an impossible combination, skipped, when its config is invalid but its
    strategy is a known one, its model runs with some strategy of the matrix (the
    strategy's default worker count, no varied options) and each of its varied option
    values runs in some other cell: ``local`` with 2 workers, more stages than blocks, admm
    with ``--optimizer kfac`` next to ddp, ``tp`` (Linear pairs) on a CNN next to ``local``.
    Any other invalid cell (an unknown strategy, a bad value, a model that no strategy of
    the matrix trains) is a mistake of the bench's options. An option the bench gives every run (``--lr``, or in
    ``--train-args``) is left out of the runs where it does not apply (``Cell.dropped``:
    ``--lr`` for admm) and refused when it applies to none of them.

    Raises:
        ConfigErrors: one line per bad configuration, naming it and what is wrong.

    Example:
        >>> [c.label for c in plan(RunConfig(), ["local"], [1, 2], ["mlp:16x1"]) if c.skip]
        ['local x2 mlp:16x1']
    """
    checked: list[tuple[Cell, list[str] | None]] = []
    plain_ok: dict[tuple[str, str], bool] = {}
    fixed = [k for k in (given_options(base) if fixed is None else fixed) if k not in BENCH_FLAGS]
    own = RunConfig().to_dict()
    misfits: dict[str, str] = {}  # a fixed option that applies to no cell: why, for the first
    fits: set[str] = set()
    for strategy in strategies:
        for model in models:
            plain = dataclasses.replace(base, strategy=strategy, workers=None, model=model)
            for options in variants:
                typed = {k: coerce(k, v, "flag") for k, v in options}
                for w in workers:
                    cfg = dataclasses.replace(
                        base, strategy=strategy, workers=w, model=model, **typed
                    )
                    why = {k: does_not_apply(k, cfg) for k in fixed}
                    fits.update(k for k, v in why.items() if v is None)
                    for k, v in why.items():
                        if v is not None:
                            misfits.setdefault(k, v)
                    dropped = tuple(sorted(k for k, v in why.items() if v is not None))
                    cfg = dataclasses.replace(cfg, **{k: own[k] for k in dropped})
                    plain = dataclasses.replace(plain, **{k: own[k] for k in dropped})
                    cell = Cell(strategy, w, model, _own(options, cfg, own), dropped=dropped)
                    checked.append((cell, _problems(cfg)))
            plain_ok[strategy, model] = _problems(plain) is None
    nowhere = [f"--{k.replace('_', '-')}{misfits[k]}" for k in fixed if k not in fits]
    if nowhere:  # given for the bench, and of use to none of its runs: a mistake
        raise ConfigErrors(nowhere)
    runs = {o for cell, problems in checked if problems is None for o in cell.options}
    trained = {m for (_, m), ok in plain_ok.items() if ok}  # models some strategy trains
    known = set(strategy_names())
    cells: list[Cell] = []
    bad: dict[str, list[str]] = {}  # each problem once, with the configurations that have it
    for cell, problems in checked:
        if problems is None:
            cells.append(cell)
        elif cell.strategy in known and cell.model in trained and runs.issuperset(cell.options):
            cells.append(dataclasses.replace(cell, skip="; ".join(problems)))
        else:
            bad.setdefault("; ".join(problems), []).append(cell.label)
    if bad:
        raise ConfigErrors([f"{_some(labels)}: {problem}" for problem, labels in bad.items()])
    return cells


def _own(options: Options, cfg: RunConfig, own: dict[str, object]) -> Options:
    """A cell's varied ``options`` less those at their default that do not apply to its
    strategy: ``jimu plan --replicas 1,2`` runs ddp as plain ddp (``jimu train`` refuses a
    ``--replicas 1`` given to ddp), and labels it so."""
    return tuple(
        (k, v) for k, v in options if getattr(cfg, k) != own[k] or does_not_apply(k, cfg) is None
    )


def _some(labels: list[str], shown: int = 3) -> str:
    """``labels`` for one line: the first few, then how many more.

    Example:
        >>> _some(["a", "b", "c", "d", "e"])
        'a, b, c and 2 more'
    """
    rest = len(labels) - shown
    return ", ".join(labels[:shown]) + (f" and {rest} more" if rest > 0 else "")
