"""validate: a RunConfig checked in one pass, its defaults filled in, before any worker starts.

One pass: the facts the checks and defaults depend on are gathered once (:func:`gather`: the
options the user gave, the data set's family, the strategy's registry entry, the model's
blocks), the defaults resolved by one function in the documented order
(:func:`resolve_defaults`, :mod:`deepjimu.defaults`), then every option group's checks and
the checks between groups (:meth:`~deepjimu.config.RunConfig.problems`), where each given
option applies (:mod:`deepjimu.applies`), the strategy's traits against the run, and last
the strategy's own checks. It sits above the registries of strategies, models and data
sets, which the config layer below may not ask.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepjimu.choices import Device, Family, Precision
from deepjimu.config import ConfigErrors, RunConfig, given_options, option_fields, option_label
from deepjimu.data import dataset_family, dataset_names, datasets_of
from deepjimu.defaults import DEFAULT_LR, describe, table_defaults
from deepjimu.errors import JimuError
from deepjimu.models import count_blocks, parse_spec
from deepjimu.options import narrow
from deepjimu.strategies import get_strategy
from deepjimu.strategies.registry import ENTRIES, Entry, applies, entry

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Facts", "defaults_line", "does_not_apply", "gather", "resolve_defaults", "validate"]


@dataclass(frozen=True)
class Facts:
    """What a run's defaults and checks depend on, gathered once.

    ``given``: the options the user gave, each with where (:func:`given_options`);
    ``family``: of the data set (None: unknown); ``strategy``: its registry entry (None:
    unknown); ``n_blocks``: the model's blocks (0 where unknown); ``problems``: what
    gathering found (an unknown data set or strategy, a bad model spec), one line each.
    """

    given: dict[str, str]
    family: Family | None
    strategy: Entry | None
    n_blocks: int
    problems: tuple[str, ...]


def validate(cfg: RunConfig, model: nn.Sequential | None = None) -> RunConfig:
    """Check every field and fill the defaults; the result is what workers run.

    Args:
        cfg: the options.
        model: the model, when a Python factory builds it (``cfg.model`` is then its
            ``factory:`` spec, which says nothing of its shape): the strategy counts its
            blocks, or refuses it (``Strategy.model_blocks``); without it such a run is
            refused (the factory is not at hand: a CLI resume of a ``fit`` run).

    Returns:
        a new RunConfig with the defaults resolved (:func:`resolve_defaults`: the data
        family's table, ``workers``, ``epochs``, ``lr``) and ``given`` (:func:`given_options`).

    Raises:
        ConfigErrors: one line per bad field (unknown strategy or dataset, workers < 1,
            more workers than blocks for a strategy that splits the model, an option given
            for a run where it does not apply, ...).
    """
    facts = gather(cfg, model)
    cfg, _ = resolve_defaults(cfg, facts)
    problems = _problems(cfg, facts)
    if problems:
        raise ConfigErrors(problems)
    return dataclasses.replace(cfg, given=facts.given)


def gather(cfg: RunConfig, model: nn.Sequential | None = None) -> Facts:
    """The facts of ``cfg`` (see :class:`Facts`); ``model``: a factory's, as :func:`validate`."""
    problems: list[str] = []
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
    found: Entry | None = None
    try:
        found = entry(cfg.strategy)
    except JimuError as e:
        problems.append(str(e))
    if found is not None and factory and model is not None:
        try:
            n_blocks = get_strategy(found.name).model_blocks(model)
        except JimuError as e:
            problems.append(f"model {cfg.model}: {e}")
    return Facts(given_options(cfg), dataset_family(cfg.dataset), found, n_blocks, tuple(problems))


def resolve_defaults(cfg: RunConfig, facts: Facts) -> tuple[RunConfig, dict[str, Any]]:
    """``cfg`` with its defaults resolved in :mod:`deepjimu.defaults`' order, and what the
    family table set.

    The user's values stand; the family table (the strategy's own rows over the family's
    row for all) sets the options that apply to the run, that the user did not give and
    that still hold their own default, nothing for a resumed run (its saved options
    stand); then the strategy's ``workers`` and ``epochs`` and the optimizer's ``lr`` where
    still unset. The model kind's admm options stay ``auto`` (``None``) for the strategy.
    """
    table = _table(cfg, facts)
    cfg = dataclasses.replace(cfg, **table)
    if facts.strategy is None:
        return cfg, table
    traits = facts.strategy.traits
    resolved = dataclasses.replace(
        cfg,
        workers=cfg.workers if cfg.workers is not None else traits.default_workers,
        epochs=cfg.epochs if cfg.epochs is not None else traits.default_epochs,
        lr=cfg.lr if cfg.lr is not None else DEFAULT_LR.get(cfg.optimizer),  # type: ignore[call-overload]
    )
    return resolved, table


def defaults_line(cfg: RunConfig) -> str | None:
    """``defaults for graph data: model mlp:256x2, epochs 50``: what the family's table sets
    for ``cfg`` (the options as the user gave them; None: nothing)."""
    facts = gather(cfg)
    chosen = _table(cfg, facts)
    return describe(facts.family, chosen) if chosen and facts.family is not None else None


def _table(cfg: RunConfig, facts: Facts) -> dict[str, Any]:
    """What the family table sets for ``cfg`` (see :func:`resolve_defaults`)."""
    if facts.family is None or cfg.resume:
        return {}
    own = RunConfig().to_dict()
    rows = facts.strategy.family_defaults if facts.strategy is not None else None
    # the run's length is one option in two units: a given --epochs keeps the table's steps out
    length = {"steps"} if "epochs" in facts.given else set()
    table = {
        k: v
        for k, v in table_defaults(facts.family, rows).items()
        if k not in facts.given and k not in length and getattr(cfg, k) == own[k] and v != own[k]
    }
    candidate = dataclasses.replace(cfg, **table)
    return {k: v for k, v in table.items() if does_not_apply(k, candidate) is None}


def _problems(cfg: RunConfig, facts: Facts) -> list[str]:
    """Every problem of the resolved ``cfg``, one line each, in one pass: the groups' checks
    and those between groups (an option given where it does not apply is refused as such,
    its value not judged), what gathering found, the strategy's traits, and, where all
    that holds, the strategy's own checks."""
    misplaced = _misplaced(cfg, facts)
    own = RunConfig().to_dict()
    problems = dataclasses.replace(cfg, **{k: own[k] for k in misplaced}).problems()
    problems += [*misplaced.values(), *facts.problems]
    if facts.strategy is None:
        return problems
    problems += _trait_problems(cfg, facts.strategy, facts)
    if getattr(cfg, "steps", None) is not None and "epochs" in facts.given:
        problems.append("give the run's length once: --epochs or --steps, not both")
    if not problems:
        strategy = get_strategy(cfg.strategy)
        problems += strategy.problems(narrow(cfg, facts.strategy.options), facts.n_blocks)
    return problems


def _trait_problems(cfg: RunConfig, strategy: Entry, facts: Facts) -> list[str]:
    """The run against its strategy's traits: workers, blocks, precision, graph models."""
    problems = []
    traits, workers, name = strategy.traits, cfg.workers, cfg.strategy
    assert workers is not None, "defaults not resolved"
    if traits.max_workers is not None and workers > traits.max_workers:
        problems.append(
            f"strategy {name} runs on at most {traits.max_workers} worker(s) (workers: {workers})"
        )
    if 1 <= workers < traits.min_workers:
        problems.append(
            f"strategy {name} needs at least {traits.min_workers} workers (workers: {workers})"
        )
    stages = workers // cfg.replicas if cfg.replicas >= 1 else workers
    if cfg.replicas > 1 and not workers % cfg.replicas and 1 <= stages < traits.min_workers:
        problems.append(
            f"strategy {name} needs at least {traits.min_workers} workers in each replica "
            f"(workers: {workers}, replicas: {cfg.replicas}, stages: {stages})"
        )
    if traits.splits_model and facts.n_blocks and stages > facts.n_blocks:
        per, shape = "worker", f"workers: {workers}"
        if cfg.replicas > 1:
            per, shape = "stage", f"{shape}, stages: {stages}"
        problems.append(
            f"strategy {name} needs at least one block per {per} "
            f"({shape}, blocks in {cfg.model}: {facts.n_blocks})"
        )
    if isinstance(cfg.precision, Precision) and cfg.precision not in traits.precisions:
        problems.append(
            f"strategy {name} does not support --precision {cfg.precision} "
            f"(supported: {', '.join(traits.precisions)})"
        )
    if cfg.precision == Precision.TF32 and cfg.device == Device.CPU:
        problems.append("precision tf32 needs --device cuda or auto (TF32 is a GPU mode)")
    return problems + _graph_model_problems(cfg, strategy, facts) + _text_problems(cfg, facts)


def _text_problems(cfg: RunConfig, facts: Facts) -> list[str]:
    """A language model (gpt) reads text data, and text data needs a language model: its
    targets are a sequence of next tokens, not a class."""
    if facts.family is None or not facts.n_blocks:
        return []
    is_gpt, is_text = parse_spec(cfg.model).kind == "gpt", facts.family == Family.TEXT
    if is_gpt and not is_text:
        return [
            f"model {cfg.model} is a language model: it trains on text data "
            f"({', '.join(datasets_of(Family.TEXT))}; dataset: {cfg.dataset})"
        ]
    if is_text and not is_gpt:
        return [
            f"dataset {cfg.dataset} is text, whose targets are each next character: it trains "
            f"a gpt:LAYERSxWIDTH:HEADS model (model: {cfg.model})"
        ]
    return []


def _graph_model_problems(cfg: RunConfig, strategy: Entry, facts: Facts) -> list[str]:
    """Graphs (issue 10): a graph model takes the whole graph, in one process, of graph data."""
    problems = []
    if facts.n_blocks and parse_spec(cfg.model).needs_graph:
        if not strategy.traits.graph_models:
            ones = ", ".join(e.name for e in ENTRIES if e.traits.graph_models)
            problems.append(
                f"model {cfg.model} trains on the whole graph: only --strategy {ones} runs it "
                f"(strategy: {cfg.strategy})"
            )
        if facts.family != Family.GRAPH:
            problems.append(
                f"model {cfg.model} needs a graph data set "
                f"({', '.join(datasets_of(Family.GRAPH))}; dataset: {cfg.dataset})"
            )
    return problems


def _misplaced(cfg: RunConfig, facts: Facts) -> dict[str, str]:
    """The options the user gave for a run where they do not apply (their declaration,
    :mod:`deepjimu.applies`), each with its line, e.g. ``--graph-hops applies to graph data
    sets (...); dataset digits is not one``. Nothing while the strategy is unknown (its
    own line names it)."""
    if facts.strategy is None:
        return {}
    known = {f.name for f in option_fields()}
    out = {}
    for name, source in facts.given.items():
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
    where = applies(name)
    value = getattr(cfg, name)
    for declared, label in ((where, ""), (where.of_value(value), f" {value}")):
        why = declared.refusal(cfg, family) if declared is not None else None
        if declared is not None and why is not None:
            return f"{label} applies to {declared.text(datasets_of)}; {why}"
    return None


def _needs_its_factory(cfg: RunConfig) -> str:
    """The refusal of a run whose model only a Python factory builds, without the factory."""
    if cfg.resume:
        return (
            f"--resume {cfg.resume}: its model comes from a Python factory ({cfg.model}); "
            f"resume it with deepjimu.fit(..., resume={str(cfg.resume)!r})"
        )
    return f"model {cfg.model} comes from a Python factory: train it with deepjimu.fit(...)"
