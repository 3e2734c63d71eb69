"""validate: a RunConfig checked against the registries (strategies, models, data sets), defaults filled in.

It sits above config.py and the registries: config.py checks single fields and needs no
registry, the registries need only config.py's types, and this module asks both.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from deepjimu.choices import Device, Optimizer, Precision
from deepjimu.config import (
    DEFAULT_LR,
    ConfigErrors,
    RunConfig,
    basic_problems,
    kfac_worker_problems,
)
from deepjimu.data import GRAPH_DATASETS, dataset_names
from deepjimu.errors import JimuError
from deepjimu.models import count_blocks, parse_spec
from deepjimu.strategies import get_strategy

if TYPE_CHECKING:
    from torch import nn

__all__ = ["validate"]


def validate(cfg: RunConfig, model: nn.Sequential | None = None) -> RunConfig:
    """Check every field and fill the strategy's defaults; the result is what workers run.

    Args:
        cfg: the options.
        model: the model, when a Python factory builds it (``cfg.model`` is then its
            ``factory:`` spec, which says nothing of its shape): the strategy counts its
            blocks, or refuses it (``Strategy.model_blocks``); without it such a run is
            refused (the factory is not at hand: a CLI resume of a ``fit`` run).

    Returns:
        a new RunConfig with ``workers``, ``epochs`` and ``lr`` set.

    Raises:
        ConfigErrors: one line per bad field (unknown strategy or dataset, workers < 1,
            more workers than blocks for a strategy that splits the model, ...).
    """
    problems = basic_problems(cfg)
    if cfg.dataset not in dataset_names():
        problems.append(f"unknown dataset {cfg.dataset!r} (known: {', '.join(dataset_names())})")
    n_blocks, factory = 0, False
    try:
        factory = parse_spec(cfg.model).kind == "factory"
        if not factory:
            n_blocks = count_blocks(cfg.model)
        elif model is None:
            problems.append(_needs_its_factory(cfg))
    except JimuError as e:
        problems.append(str(e))
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
    if strategy.max_workers is not None and workers > strategy.max_workers:
        problems.append(
            f"strategy {cfg.strategy} runs on at most {strategy.max_workers} worker(s) (workers: {workers})"
        )
    if strategy.splits_model and n_blocks and workers > n_blocks:
        problems.append(
            f"strategy {cfg.strategy} needs at least one block per worker "
            f"(workers: {workers}, blocks in {cfg.model}: {n_blocks})"
        )
    if isinstance(cfg.precision, Precision) and cfg.precision not in strategy.precisions:
        problems.append(
            f"strategy {cfg.strategy} does not support --precision {cfg.precision} "
            f"(supported: {', '.join(strategy.precisions)})"
        )
    if (cfg.compress != "none" or cfg.local_sgd) and not strategy.reduces_gradients:
        problems.append(
            f"strategy {cfg.strategy} has no gradient all-reduce to compress or replace; "
            f"--compress and --local-sgd need ddp (compress: {cfg.compress}, local-sgd: {cfg.local_sgd})"
        )
    if cfg.precision == Precision.TF32 and cfg.device == Device.CPU:
        problems.append("precision tf32 needs --device cuda or auto (TF32 is a GPU mode)")
    # kfac (issue 12)
    if cfg.optimizer == Optimizer.KFAC and not strategy.supports_kfac:
        problems.append(
            f"optimizer kfac runs with strategy local or ddp (strategy: {cfg.strategy})"
        )
    if cfg.optimizer == Optimizer.KFAC and workers >= 1:
        problems.extend(kfac_worker_problems(cfg.kfac_grad_workers, workers))
    # graphs (issue 10): a graph model takes the whole graph, in one process
    if n_blocks and parse_spec(cfg.model).needs_graph:
        if not strategy.graph_models:
            problems.append(
                f"model {cfg.model} trains on the whole graph: only --strategy local runs it "
                f"(strategy: {cfg.strategy})"
            )
        if cfg.dataset not in GRAPH_DATASETS:
            problems.append(
                f"model {cfg.model} needs a graph data set ({', '.join(sorted(GRAPH_DATASETS))}; "
                f"dataset: {cfg.dataset})"
            )
    if not problems:
        problems.extend(strategy.problems(cfg, n_blocks))
    if problems:
        raise ConfigErrors(problems)
    lr = cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.optimizer]
    epochs = cfg.epochs if cfg.epochs is not None else strategy.default_epochs
    return dataclasses.replace(cfg, workers=workers, epochs=epochs, lr=lr)


def _needs_its_factory(cfg: RunConfig) -> str:
    """The refusal of a run whose model only a Python factory builds, without the factory."""
    if cfg.resume:
        return (
            f"--resume {cfg.resume}: its model comes from a Python factory ({cfg.model}); "
            f"resume it with deepjimu.fit(..., resume={str(cfg.resume)!r})"
        )
    return f"model {cfg.model} comes from a Python factory: train it with deepjimu.fit(...)"
