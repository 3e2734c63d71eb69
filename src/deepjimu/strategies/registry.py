"""The strategies, one entry each: class, option groups, traits, predictor, probe, plot colour, family defaults.

Adding a strategy is its module (or package) under ``strategies/`` plus its entry here;
no other module of deepjimu names a strategy (``tests/test_house.py`` checks it): the
engine, validation, the probe, the planner, the bench and its plots read what they need
from the entry. No torch import here, so that ``--help`` stays light: the class is
imported on first use (:meth:`Entry.load`).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deepjimu.applies import Applies, Takers
from deepjimu.balance import listed_balance
from deepjimu.choices import Family, Precision
from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster
from deepjimu.cost.memory import (
    BASE_BYTES,
    IN_PROCESS_BYTES,
    MemoryModel,
    admm_state,
    fsdp_state,
    replicated_state,
    staged_state,
    tensor_state,
    transients,
    with_whole_model,
    worker_peak,
)
from deepjimu.cost.predict.admm import layer_parallel
from deepjimu.cost.predict.common import Prediction
from deepjimu.cost.predict.replicated import data_parallel, fully_sharded, one_process
from deepjimu.cost.predict.staged import chain, pipelined
from deepjimu.cost.predict.tensor import tensor_parallel
from deepjimu.cost.profile import Compute, Layer
from deepjimu.errors import JimuError
from deepjimu.options import (
    AdmmOptions,
    DdpOptions,
    GradientOptions,
    Group,
    LocalOptions,
    PipelineOptions,
    RunGroup,
    SyncGroup,
    applies_of,
)

__all__ = [
    "ENTRIES",
    "Entry",
    "Predictor",
    "Traits",
    "applies",
    "builds_in_parts",
    "compressing",
    "entry",
    "entry_traits",
    "family_rows",
    "predict",
    "rank_peaks",
    "reference",
    "strategy_names",
    "taking",
]

Predictor = Callable[[RunConfig, list[Layer], int, Compute, Cluster], Prediction]
"""A strategy's predictor (:mod:`deepjimu.cost.predict`): one run's figures on a cluster,
from the run's validated config, the model's blocks, the training-set size and the
model's work on one rank."""


@dataclass(frozen=True)
class Traits:
    """What the engine, validation and the planner need to know of a strategy.

    ``default_workers`` / ``default_epochs``: used where the user gives none;
    ``min_workers`` / ``max_workers``: e.g. 1 and 1 for one process (None: any);
    ``splits_model``: each worker owns contiguous blocks, so workers <= blocks;
    ``replicates``: ``--replicas R`` runs R copies of its split side by side, each on 1/R of
    the data (:mod:`deepjimu.mesh`), so stages = workers / R <= blocks;
    ``shards_model``: each worker holds a shard of every parameter; ``shards_data``: each
    worker loads only its rows; ``needs_group``: a process group even for one worker (as DDP
    wants);
    ``graph_models``: it trains models that take the whole graph (``gcn``);
    ``precisions``: the ``--precision`` values it supports (bf16 only where its compute
    runs under :meth:`~deepjimu.run.Run.autocast` and its messages do not depend on the
    activations' dtype); ``reference``: the one-process run every speedup is measured
    against where a strategy has no run of one worker itself; ``pipelined``: its steps run
    micro-batches through a schedule (the bench plots its idle fraction against the
    schedule's bubble); ``base_mb``: what a CPU worker of it holds beyond
    :data:`~deepjimu.cost.memory.BASE_BYTES` (its own modules, or the launcher's process it
    runs in), measured as that constant was.
    """

    default_workers: int = 1
    default_epochs: int = 30
    min_workers: int = 1
    max_workers: int | None = None
    splits_model: bool = False
    replicates: bool = False
    shards_model: bool = False
    shards_data: bool = False
    needs_group: bool = False
    graph_models: bool = False
    precisions: tuple[Precision, ...] = (Precision.FP32, Precision.TF32)
    reference: bool = False
    pipelined: bool = False
    base_mb: float = 0.0

    @property
    def balances(self) -> bool:
        """Whether ``--balance`` splits its work: the blocks of a split model or the rows of
        sharded data (one process has nothing to split, and tensor parallelism cuts every
        layer into equal parts)."""
        return self.splits_model or self.shards_data


def _epochs(info: Mapping[str, Any]) -> str:
    return "epoch"


@dataclass(frozen=True)
class Entry:
    """One strategy.

    ``cls``: ``"module:Class"`` of its :class:`~deepjimu.strategies.base.Strategy`;
    ``options``: the option groups it takes, composed (:mod:`deepjimu.options`: it is
    handed only those, and an option of a group applies only to the strategies that take
    it); ``predict``: its predictor (None: the planner does not predict it); ``probed``:
    the probe times its own step (its class's ``probe_step``, :mod:`deepjimu.measure.probe`);
    ``color``: its colour in every plot (None: one fixed by its name); ``family_defaults``:
    per data family, the options' defaults for this strategy over the family's row for all
    (:mod:`deepjimu.defaults`); ``epoch_unit``: what one logged epoch of a run is, from its
    saved options (``epoch``; ``iteration`` where an epoch is one full-batch iteration);
    ``replica_runtime``: the strategy whose runtime per unit its ``--replicas`` pay beside
    its own (tp: fsdp, which shards its blocks over the replicas), as the probe priced it.
    """

    name: str
    cls: str
    options: type[RunGroup]
    traits: Traits
    predict: Predictor | None = None
    memory: MemoryModel = replicated_state
    probed: bool = False
    color: str | None = None
    family_defaults: Mapping[Family, Mapping[str, Any]] = field(default_factory=dict)
    epoch_unit: Callable[[Mapping[str, Any]], str] = _epochs
    replica_runtime: str | None = None

    def load(self) -> type[Any]:
        """The strategy's class (its module imported now; typed by
        :func:`deepjimu.strategies.get_strategy`)."""
        module, name = self.cls.split(":")
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]

    def takes(self, group: type[Group]) -> bool:
        """Whether the strategy takes ``group``'s options."""
        return issubclass(self.options, group)


# colours: tab10's, one per strategy whatever else a bench runs
ENTRIES: tuple[Entry, ...] = (
    Entry(
        "local",
        "deepjimu.strategies.local:LocalStrategy",
        LocalOptions,
        Traits(max_workers=1, graph_models=True, precisions=tuple(Precision), reference=True),
        predict=one_process,
        color="#1f77b4",
    ),
    Entry(
        "ddp",
        "deepjimu.strategies.ddp:DDPStrategy",
        DdpOptions,
        Traits(default_workers=2, shards_data=True, needs_group=True, precisions=tuple(Precision)),
        predict=data_parallel,
        probed=True,
        color="#ff7f0e",
    ),
    Entry(
        "fsdp",
        "deepjimu.strategies.fsdp:FSDPStrategy",
        GradientOptions,
        # base: torch.distributed.tensor and fsdp's modules (320 MB measured, as BASE_BYTES);
        # at least 2 workers, as tp: one has nothing to shard, and torch's FSDP2 on a world
        # of one stepped mlp:256x3 at 0.27x local's rate (jimu plan --check, 2026-11-28)
        Traits(
            default_workers=2,
            min_workers=2,
            shards_data=True,
            shards_model=True,
            replicates=True,
            needs_group=True,
            precisions=tuple(Precision),
            base_mb=5,
        ),
        predict=fully_sharded,
        memory=fsdp_state,
        probed=True,
        color="#8c564b",
    ),
    Entry(
        "tp",
        "deepjimu.strategies.tp:TensorParallelStrategy",
        GradientOptions,
        # base: torch.distributed.tensor's modules
        Traits(
            default_workers=2,
            min_workers=2,
            shards_model=True,
            replicates=True,
            needs_group=True,
            base_mb=6,
        ),
        predict=tensor_parallel,
        memory=tensor_state,
        probed=True,
        color="#e377c2",
        replica_runtime="fsdp",
    ),
    Entry(
        "model-parallel",
        "deepjimu.strategies.model_parallel:ModelParallelStrategy",
        GradientOptions,
        Traits(default_workers=2, splits_model=True, replicates=True),
        predict=chain,
        memory=staged_state,
        probed=True,
        color="#2ca02c",
    ),
    Entry(
        "pipeline",
        "deepjimu.strategies.pipeline:PipelineStrategy",
        PipelineOptions,
        # base: torch.distributed.pipelining's modules (316 MB measured, as BASE_BYTES)
        Traits(
            default_workers=2,
            min_workers=2,
            splits_model=True,
            replicates=True,
            pipelined=True,
            base_mb=2,
        ),
        predict=pipelined,
        memory=staged_state,
        probed=True,
        color="#d62728",
    ),
    Entry(
        "admm",
        "deepjimu.strategies.admm.strategy:AdmmStrategy",
        AdmmOptions,
        # every precision: under bf16 only the products drop to bfloat16 (updates.py adds
        # them to float32 terms), so every exchanged p and q is still float32; base: its
        # workers run no autograd step and no DDP, 247 MB measured where ddp's took 315
        Traits(default_workers=2, splits_model=True, replicates=True, precisions=tuple(Precision)),
        predict=layer_parallel,
        memory=admm_state,
        color="#9467bd",
        # chosen on Cora's validation split only (issue 27; BENCHMARKS.md section 11): a
        # ridge of 1, the middle of what held on Cora's random splits and label-scarce sbm
        family_defaults={Family.GRAPH: {"model": "mlp:256x1", "epochs": 50, "admm_ridge": 1.0}},
        # full batch, an epoch is one pdADMM iteration over every training sample
        epoch_unit=lambda info: "epoch" if info.get("admm_batch") else "iteration",
    ),
)
"""Every strategy, in the order of ``--help``, ``jimu bench`` and ``jimu plan``."""

_BY_NAME = {e.name: e for e in ENTRIES}


def strategy_names() -> list[str]:
    """Registered strategy names, in registry order."""
    return list(_BY_NAME)


def entry(name: str) -> Entry:
    """The entry of strategy ``name``.

    Raises:
        JimuError: no such strategy.
    """
    if name not in _BY_NAME:
        raise JimuError(f"unknown strategy {name!r} (known: {', '.join(_BY_NAME)})")
    return _BY_NAME[name]


def entry_traits(name: str) -> Traits:
    """The traits of strategy ``name`` (a name no entry has: the defaults')."""
    return _BY_NAME[name].traits if name in _BY_NAME else Traits()


def reference() -> str:
    """The one-process strategy that speedups are measured against (``Traits.reference``)."""
    return next(e.name for e in ENTRIES if e.traits.reference)


def taking(group: type[Group]) -> tuple[str, ...]:
    """The strategies that take ``group``'s options, in registry order."""
    return tuple(e.name for e in ENTRIES if e.takes(group))


def compressing() -> str:
    """The strategy whose ``--compress`` the probe serves (``jimu probe``, ``--compress
    auto``): the first that takes the gradient sync's options."""
    return taking(SyncGroup)[0]


def _named(takers: Takers) -> tuple[str, ...]:
    """The strategies that :class:`~deepjimu.applies.Takers` describe, in registry order."""
    return tuple(
        e.name
        for e in ENTRIES
        if (takers.group is None or e.takes(takers.group))
        and (takers.trait is None or takers.trait(e.traits))
    )


def applies(name: str) -> Applies:
    """Where option ``name`` applies (:func:`deepjimu.options.applies_of`), the strategies
    it applies to named.

    Raises:
        KeyError: no option group declares it.
    """
    return applies_of(name).resolved(_named)


def family_rows() -> dict[str, Mapping[Family, Mapping[str, Any]]]:
    """Each strategy's rows of the family defaults (:attr:`Entry.family_defaults`), by name."""
    return {e.name: e.family_defaults for e in ENTRIES if e.family_defaults}


def predict(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """The prediction for ``cfg`` (a validated config) by its strategy's predictor.

    Args:
        cfg: the run (its ``strategy``, ``workers`` and the options its strategy reads).
        layers: the model's blocks (:func:`deepjimu.measure.compute.layers_of`).
        train_size: training samples per epoch.
        compute: seconds of the model's work on one rank.
        cluster: the ranks' links (and cores, on a CPU node).

    Raises:
        ValueError: a strategy or option the planner does not predict, or more workers
            than the cluster has ranks.
    """
    assert cfg.workers is not None, "config not resolved"
    if cfg.workers > cluster.world:
        raise ValueError(f"{cfg.workers} workers on a cluster of {cluster.world} ranks")
    predictor = entry(cfg.strategy).predict
    if predictor is None:
        raise ValueError(f"the planner does not predict strategy {cfg.strategy}")
    replicas_by = entry(cfg.strategy).replica_runtime
    if replicas_by is not None:  # what its replicas' sharding pays per unit, by its own key
        paid = cluster.action_s.get(replicas_by, 0.0)
        actions = cluster.action_s | {f"{cfg.strategy}:replicas": paid}
        cluster = dataclasses.replace(cluster, action_s=actions)
    out = predictor(cfg, layers, train_size, compute, cluster)
    data = train_size * (layers[0].in_elems if layers else 0) * 4  # the training set's floats
    peaks = rank_peaks(cfg, layers, train_size, data, cluster.gpus)
    return dataclasses.replace(out, peak_mem_mb=max(peaks) / 1e6)


def rank_peaks(
    cfg: RunConfig,
    layers: list[Layer],
    train_size: int,
    data_bytes: int,
    cuda: bool,
    whole: bool = True,
    cut: list[int] | None = None,
) -> list[int]:
    """Each rank's predicted peak memory in bytes (:mod:`deepjimu.cost.memory`): what
    ``cfg``'s strategy puts on it, and on a CPU its runtime and, for the ``whole`` process
    (not what ``--memory-limit`` counts), its base and the data it maps. ``cut``: a split
    model's blocks per rank where known (a finished run's, whose measured block times cut
    it), else as its ``--balance`` would from the blocks' FLOPs.

    Example:
        >>> from deepjimu.cost.profile import Layer
        >>> cfg = RunConfig(strategy="ddp", workers=2, batch_size=2)
        >>> rank_peaks(cfg, [Layer("0", 0.0, 10, 4, 2)], 100, 0, cuda=True)
        [312, 312]
    """
    e = entry(cfg.strategy)
    base = BASE_BYTES + e.traits.base_mb * 2**20
    # one worker runs in the launcher's own process, unless something sets it apart
    if cfg.workers == 1 and not (cfg.memory_limit or cfg.emulate_speeds or cfg.max_restarts):
        base += IN_PROCESS_BYTES
    given = dataclasses.replace(cfg, balance=",".join(map(str, cut))) if cut else cfg
    states = e.memory(given, layers, train_size)
    if e.memory is not replicated_state:  # its part, beside the whole model it was built from
        # a stage split by the blocks' measured times (not listed, not by size) times them
        timed = e.memory is staged_state and not (
            listed_balance(str(cfg.balance)) or cfg.balance == "size"
        )
        parts = (cfg.workers or 1) > 1 and builds_in_parts(cfg)
        states = with_whole_model(states, layers, not e.traits.splits_model, timed, parts)
    # a step's transients: in the state of a stage's rank (its own blocks') and of fsdp's
    # (the unsharded block's gradient is the backward's; its optimizer steps on shards)
    if e.memory not in (staged_state, fsdp_state):
        states = [s + transients(layers) for s in states]
    return [worker_peak(s, base, data_bytes, cuda, whole) for s in states]


def builds_in_parts(cfg: RunConfig) -> bool:
    """Whether a worker of ``cfg``'s run (of several, its model from its spec) builds its
    model a block at a time, holding only its part: its own blocks (``splits_model``) or its
    shards of each (``shards_model``), where the spec is built a block at a time (``mlp``,
    ``cnn``); another spec's model, or a factory's, is built whole first."""
    traits = entry(cfg.strategy).traits
    # the spec's kind by its prefix: parsing it would load the models, and torch, into the
    # CLI's parser (which must plan threads first)
    splits = traits.splits_model or traits.shards_model
    return splits and cfg.model.split(":")[0] in ("mlp", "cnn")
