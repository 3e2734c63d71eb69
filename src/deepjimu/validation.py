"""validate: a RunConfig checked against the registries (strategies, models, data sets), defaults filled in.

It sits above config.py and the registries: config.py checks single fields and needs no
registry, the registries need only config.py's types, and this module asks both.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from deepjimu.choices import Device, Family, Optimizer, Precision
from deepjimu.config import (
    DEFAULT_LR,
    ConfigErrors,
    RunConfig,
    applies_of,
    given_options,
    kfac_worker_problems,
    option_fields,
    option_label,
)
from deepjimu.data import dataset_family, dataset_names, datasets_of
from deepjimu.defaults import describe, table_defaults
from deepjimu.emulate import speeds_problems
from deepjimu.errors import JimuError
from deepjimu.models import count_blocks, parse_spec
from deepjimu.options import narrow
from deepjimu.strategies import get_strategy, strategy_names

if TYPE_CHECKING:
    from torch import nn

    from deepjimu.strategies.base import Strategy

__all__ = ["defaults_line", "does_not_apply", "family_defaults", "validate"]


def validate(cfg: RunConfig, model: nn.Sequential | None = None) -> RunConfig:
    """Check every field and fill the strategy's defaults; the result is what workers run.

    Args:
        cfg: the options.
        model: the model, when a Python factory builds it (``cfg.model`` is then its
            ``factory:`` spec, which says nothing of its shape): the strategy counts its
            blocks, or refuses it (``Strategy.model_blocks``); without it such a run is
            refused (the factory is not at hand: a CLI resume of a ``fit`` run).

    Returns:
        a new RunConfig with the data family's defaults (:mod:`deepjimu.defaults`),
        ``workers``, ``epochs`` and ``lr`` set, and ``given`` (:func:`given_options`).

    Raises:
        ConfigErrors: one line per bad field (unknown strategy or dataset, workers < 1,
            more workers than blocks for a strategy that splits the model, an option given
            for a run where it does not apply, ...).
    """
    given = given_options(cfg)
    cfg = dataclasses.replace(cfg, **family_defaults(cfg))
    misplaced = _misplaced(cfg, given)
    # an option that does not apply is refused as such, its value not judged too
    own = RunConfig().to_dict()
    problems = dataclasses.replace(cfg, **{k: own[k] for k in misplaced}).problems()
    problems.extend(misplaced.values())
    if cfg.dataset not in dataset_names():
        problems.append(f"unknown dataset {cfg.dataset!r} (known: {', '.join(dataset_names())})")
    n_blocks, factory, spec_problems = _spec_blocks(cfg, model)
    problems.extend(spec_problems)
    try:
        strategy = get_strategy(cfg.strategy)
    except JimuError as e:
        problems.append(str(e))
        raise ConfigErrors(problems) from None
    if factory and model is not None:
        try:
            n_blocks = strategy.model_blocks(model)
        except JimuError as e:
            problems.append(f"model {cfg.model}: {e}")
    workers = cfg.workers if cfg.workers is not None else strategy.default_workers
    problems.extend(_worker_problems(cfg, strategy, workers, n_blocks))
    problems.extend(_precision_problems(cfg, strategy))
    # kfac (issue 12)
    if cfg.optimizer == Optimizer.KFAC and workers >= 1:
        problems.extend(kfac_worker_problems(cfg.kfac_grad_workers, workers))
    problems.extend(_graph_model_problems(cfg, strategy, n_blocks))
    if not problems:
        problems.extend(strategy.problems(narrow(cfg, strategy.options), n_blocks))
    if problems:
        raise ConfigErrors(problems)
    lr = cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.optimizer]
    epochs = cfg.epochs if cfg.epochs is not None else strategy.default_epochs
    return dataclasses.replace(cfg, workers=workers, epochs=epochs, lr=lr, given=given)


def _spec_blocks(cfg: RunConfig, model: nn.Sequential | None) -> tuple[int, bool, list[str]]:
    """The blocks of ``cfg.model`` by its spec (0 where a factory builds it: the strategy
    counts those), whether a factory builds it, and the spec's problems."""
    problems: list[str] = []
    n_blocks, factory = 0, False
    try:
        factory = parse_spec(cfg.model).kind == "factory"
        if not factory:
            n_blocks = count_blocks(cfg.model)
        elif model is None:
            problems.append(_needs_its_factory(cfg))
    except JimuError as e:
        problems.append(str(e))
    return n_blocks, factory, problems


def _worker_problems(
    cfg: RunConfig, strategy: type[Strategy], workers: int, n_blocks: int
) -> list[str]:
    """The worker count against the strategy's limits, the model's blocks and --emulate-speeds."""
    problems = []
    if strategy.max_workers is not None and workers > strategy.max_workers:
        problems.append(
            f"strategy {cfg.strategy} runs on at most {strategy.max_workers} worker(s) (workers: {workers})"
        )
    if strategy.splits_model and n_blocks and workers > n_blocks:
        problems.append(
            f"strategy {cfg.strategy} needs at least one block per worker "
            f"(workers: {workers}, blocks in {cfg.model}: {n_blocks})"
        )
    problems.extend(speeds_problems(cfg.emulate_speeds, workers))
    return problems


def _precision_problems(cfg: RunConfig, strategy: type[Strategy]) -> list[str]:
    """--precision against the strategy's precisions and the device."""
    problems = []
    if isinstance(cfg.precision, Precision) and cfg.precision not in strategy.precisions:
        problems.append(
            f"strategy {cfg.strategy} does not support --precision {cfg.precision} "
            f"(supported: {', '.join(strategy.precisions)})"
        )
    if cfg.precision == Precision.TF32 and cfg.device == Device.CPU:
        problems.append("precision tf32 needs --device cuda or auto (TF32 is a GPU mode)")
    return problems


def _graph_model_problems(cfg: RunConfig, strategy: type[Strategy], n_blocks: int) -> list[str]:
    """Graphs (issue 10): a graph model takes the whole graph, in one process, of graph data."""
    problems = []
    if n_blocks and parse_spec(cfg.model).needs_graph:
        if not strategy.graph_models:
            problems.append(
                f"model {cfg.model} trains on the whole graph: only --strategy local runs it "
                f"(strategy: {cfg.strategy})"
            )
        if dataset_family(cfg.dataset) != Family.GRAPH:
            problems.append(
                f"model {cfg.model} needs a graph data set "
                f"({', '.join(datasets_of(Family.GRAPH))}; dataset: {cfg.dataset})"
            )
    return problems


def _misplaced(cfg: RunConfig, given: dict[str, str]) -> dict[str, str]:
    """The options the user gave for a run where they do not apply (their declaration,
    :mod:`deepjimu.applies`), each with its line, e.g. ``--graph-hops applies to graph data
    sets (...); dataset digits is not one``. Nothing while the strategy is unknown (its
    own line names it)."""
    if cfg.strategy not in strategy_names():
        return {}
    known = {f.name for f in option_fields()}
    out = {}
    for name, source in given.items():
        why = does_not_apply(name, cfg) if name in known else None
        if why is not None:
            out[name] = option_label(name, source) + why
    return out


def does_not_apply(name: str, cfg: RunConfig) -> str | None:
    """`` applies to ...; ... is not one`` when option ``name`` (or its value) does not apply
    to ``cfg``; None when it does.

    Example:
        >>> does_not_apply("rho", RunConfig(strategy="local"))
        ' applies to strategy admm; strategy local is not one'
    """
    family = dataset_family(cfg.dataset)
    applies = applies_of(name)
    value = getattr(cfg, name)
    for where, label in ((applies, ""), (applies.of_value(value), f" {value}")):
        why = where.refusal(cfg, family) if where is not None else None
        if where is not None and why is not None:
            return f"{label} applies to {where.text(datasets_of)}; {why}"
    return None


def family_defaults(cfg: RunConfig) -> dict[str, Any]:
    """What the table of ``cfg``'s data family sets for this run (:mod:`deepjimu.defaults`).

    Only options that the user did not give, that still hold their own default and that
    apply to the run; nothing for a resumed run, whose saved options stand.

    Example:
        >>> family_defaults(RunConfig(dataset="digits"))
        {}
    """
    family = dataset_family(cfg.dataset)
    if family is None or cfg.resume:
        return {}
    given = given_options(cfg)
    own = RunConfig().to_dict()
    table = {
        k: v
        for k, v in table_defaults(family, cfg.strategy).items()
        if k not in given and getattr(cfg, k) == own[k] and v != own[k]
    }
    candidate = dataclasses.replace(cfg, **table)
    return {k: v for k, v in table.items() if does_not_apply(k, candidate) is None}


def defaults_line(cfg: RunConfig) -> str | None:
    """``defaults for graph data: model mlp:256x2, epochs 50``: what the family's table sets
    for ``cfg`` (None: nothing)."""
    chosen = family_defaults(cfg)
    family = dataset_family(cfg.dataset)
    return describe(family, chosen) if chosen and family is not None else None


def _needs_its_factory(cfg: RunConfig) -> str:
    """The refusal of a run whose model only a Python factory builds, without the factory."""
    if cfg.resume:
        return (
            f"--resume {cfg.resume}: its model comes from a Python factory ({cfg.model}); "
            f"resume it with deepjimu.fit(..., resume={str(cfg.resume)!r})"
        )
    return f"model {cfg.model} comes from a Python factory: train it with deepjimu.fit(...)"
