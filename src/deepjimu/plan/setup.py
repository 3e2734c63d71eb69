"""The cluster and the compute figures of a plan: measured here (``--cluster probe``) or from a cluster file.

``probe`` times this machine: its collectives by ``jimu probe`` over as many real
workers as the plan's largest configuration (at least 2; the ring formulas of
:class:`~deepjimu.cost.cluster.Cluster` carry the fit to other worker counts), its cores
(:func:`deepjimu.threads.available_cores`), and the model's work in this process
(:class:`~deepjimu.measure.compute.MeasuredCompute`; one worker's at the threads its run
gets, every figure under a one-worker run's OpenMP wait policy:
:mod:`deepjimu.plan.measuring`). A TOML file describes a cluster that
is not here: the model's FLOPs over its device's rate
(:class:`~deepjimu.cost.profile.AnalyticCompute`). A ``probe.json`` of ``jimu probe``
(run anywhere: two nodes under torchrun over their real link) gives the collectives of
that link, with the model's work measured here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from functools import cache, partial
from pathlib import Path
from typing import Any

import torch

from deepjimu.choices import Schedule
from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster, Device, Link, probed_cluster
from deepjimu.cost.cluster_file import read_cluster
from deepjimu.cost.predict.replicated import ddp_comm
from deepjimu.cost.predict.staged import staged_step
from deepjimu.cost.probe import Probe, TimedStep, read_probe, relative_spread
from deepjimu.cost.profile import AnalyticCompute, Compute, Layer
from deepjimu.data import DataOptions, load_dataset
from deepjimu.devices import pick_device
from deepjimu.emulate import parse_speeds
from deepjimu.errors import JimuError
from deepjimu.kfac.layers import kfac_candidates
from deepjimu.launch import probe
from deepjimu.measure.blocks import layers_of
from deepjimu.measure.compute import ROUNDS, MeasuredCompute
from deepjimu.models import build_model
from deepjimu.plan.measuring import on_paper
from deepjimu.strategies.admm.model import admm_layers
from deepjimu.strategies.registry import entry
from deepjimu.threads import available_cores, plan_threads

__all__ = ["cluster_and_compute", "measured_spread", "noisy_measurements", "probe_cluster"]


def probe_cluster(cfg: RunConfig, workers: int, out: Path) -> tuple[Cluster, Any]:
    """This machine as a one-node cluster of ``workers`` ranks (2 or more): ``jimu probe``'s
    collective fits over that many real workers (written to ``out/probe-w<workers>``), its
    cores shared by the ranks. Also returns the probe (its ddp step of ``workers`` ranks
    stepping together, from which the sharing of the cores is measured)."""
    probed = probe(
        dataclasses.replace(
            cfg, workers=workers, runs_dir=str(out), name=f"probe-w{workers}",
            quiet=True, compress="none", given={}, emulate_speeds="", balance="even",
        )
    )  # fmt: skip
    assert probed is not None
    found = Probe.from_dict(probed["probe"])
    cores = available_cores() if found.device == "cpu" else None
    return probed_cluster(found.links, found.world, found.device, cores), found


def _probe_file(path: Path, workers: int, cfg: RunConfig, made: dict[Any, Any]) -> Cluster:
    """The cluster of a ``probe.json`` that ``jimu probe`` wrote, wherever it ran (under
    torchrun across nodes too): its fitted collectives, this machine's cores (the model's
    work is measured here)."""
    found = read_probe(path)
    if found.world < 2:
        raise JimuError(f"probe file {path} was measured on one worker: it holds no link")
    cores = available_cores() if found.device == "cpu" else None
    cluster = probed_cluster(found.links, found.world, found.device, cores)
    own, layers, _ = _model_figures(dataclasses.replace(cfg, model=found.model), made, None, True)
    return dataclasses.replace(
        cluster,
        ranks_per_node=max(workers, found.world),
        source=str(path),
        action_s=_action_s(cluster, found, cfg, own, layers),
        ddp_sync_s=_ddp_sync(cluster, found, cfg, layers),
    )


def _layers_and_data(cfg: RunConfig, shapes: bool = False) -> tuple[Any, Any, list[Layer]]:
    """The model of ``cfg`` (built as a run builds it; with ``shapes``, on the meta device:
    any model is sized on any machine, nothing allocated), its training data, and its
    blocks' sizes."""
    data = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    with torch.device("meta") if shapes else contextlib.nullcontext():
        model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
    return model, data, layers_of(model, data.train_x[:1])


def _admm_flops(model: Any, feature_shape: tuple[int, ...], cfg: RunConfig) -> Any:
    """Per layer pdADMM FLOPs of an iteration and of the readout's refit, and output widths.

    Counted when admm's predictor first asks, not here: a model that admm cannot train (a
    ``resnet:``) is still planned for the other strategies, and admm on it is not predicted,
    with admm's one line (a ValueError, as the predictors refuse what they cannot price).
    """

    @cache
    def layer_ops() -> list[Any]:
        try:
            return list(admm_layers(model, feature_shape, cg_max_iter=cfg.admm_cg_iters).ops)
        except JimuError as e:
            raise ValueError(str(e)) from None

    def flops(n: int) -> tuple[list[float], list[float], list[int]]:
        ops = layer_ops()
        costs = [op.flops(n, with_p=l > 0) for l, op in enumerate(ops)]
        refits = [op.flops(n, with_p=False) for op in ops]
        return costs, refits, [math.prod(op.out_shape) for op in ops]

    return flops


def _factors(model: Any) -> list[tuple[int, int]]:
    """K-FAC's factor sizes (n_a, n_g) of each Linear and Conv2d layer, as ``kfac.layers`` sizes them."""
    out = []
    for _, m in kfac_candidates(model):
        w = m.weight
        assert isinstance(w, torch.Tensor)
        out.append((w[0].numel() + (m.bias is not None), int(w.shape[0])))
    return out


def cluster_and_compute(
    cfg: RunConfig, cluster_arg: str, out: Path, made: dict[Any, Any], all_cfgs: list[RunConfig]
) -> tuple[Cluster, Compute, list[Layer], int]:
    """:func:`_cluster_and_compute`, its ranks at ``--emulate-speeds``' factors where given
    (the cluster is measured at full speed; the factors slow its first ranks, as the
    emulation slows the workers)."""
    cluster, compute, layers, n = _cluster_and_compute(cfg, cluster_arg, out, made, all_cfgs)
    if cfg.emulate_speeds:
        factors = parse_speeds(cfg.emulate_speeds)
        speeds = (*factors, *[1.0] * (cluster.world - len(factors)))
        cluster = dataclasses.replace(cluster, speeds=speeds)
    return cluster, compute, layers, n


def _cluster_and_compute(
    cfg: RunConfig, cluster_arg: str, out: Path, made: dict[Any, Any], all_cfgs: list[RunConfig]
) -> tuple[Cluster, Compute, list[Layer], int]:
    """The cluster, compute, blocks and training-set size that predict ``cfg``; ``made``
    keeps what configurations share (the clusters, each model's figures).

    With ``probe`` each worker count of 2 or more gets its own probe, so its collectives
    are fitted at that count, and what that many ranks stepping together on this
    machine's cores lose at each synchronisation is measured (the probe's ddp step against
    the same step of one rank alone at a fair share of the cores, :attr:`Cluster.sync_s`).
    """
    p = cfg.workers or 1
    most = max(c.workers or 1 for c in all_cfgs)
    measured = not on_paper(cluster_arg)
    if "file" not in made:
        if cluster_arg.endswith(".json"):
            made["file"] = _probe_file(Path(cluster_arg), most, cfg, made)
        elif not measured:
            made["file"] = read_cluster(cluster_arg)
    compute, layers, n = _model_figures(cfg, made, made.get("file"), measured)
    if not measured or cluster_arg.endswith(".json"):
        return made["file"], compute, layers, n
    if p < 2:
        # one worker computes on the threads its run gets (--threads, else OMP_NUM_THREADS,
        # else every core; busy=0: the wait policy, the rest of its plan, is not asked here)
        threads = plan_threads(1, cfg.threads, cfg.omp_wait, busy=0).threads
        if ("cluster", p, threads) not in made:
            made["cluster", p, threads] = _alone(pick_device(cfg, 0, 1), threads)
        return made["cluster", p, threads], compute, layers, n
    if ("cluster", p) not in made:  # solved again after measure_again, the probe kept
        if ("probed", p) not in made:
            made["probed", p] = probe_cluster(cfg, p, out)
        cluster, found = made["probed", p]
        made["probe", p] = found  # its repeats' spread: noisy_measurements
        t = cluster.threads_per_rank(p) or 1
        own, own_layers, _ = _model_figures(
            dataclasses.replace(cfg, model=found.model), made, None, True
        )
        fair = own.ddp_step(found.batch_per_rank, t) * cluster.ranks_sharing_cores(p)
        # the probe's ranks step together: what their step took beyond a fair share of
        # the cores is lost once per synchronisation
        sync = {p: max(0.0, found.compute_s - fair)}
        cluster = dataclasses.replace(cluster, sync_s=sync)
        made["cluster", p] = dataclasses.replace(
            cluster,
            action_s=_action_s(cluster, found, cfg, own, own_layers),
            ddp_sync_s=_ddp_sync(cluster, found, cfg, own_layers),
        )
    return made["cluster", p], compute, layers, n


def _action_s(
    cluster: Cluster, found: Probe, cfg: RunConfig, own: Compute, layers: list[Layer]
) -> dict[str, float]:
    """:attr:`Cluster.action_s`: each split strategy's runtime's seconds per action on
    ``cluster``, solved from the probe's step of that strategy itself (``found.steps``,
    :meth:`~deepjimu.strategies.base.Strategy.probe_step`: the pipeline's GPipe of a few
    micro-batches, the chain's batch through the stages one after the other; the probed
    model cut into the stages the probe reports) predicted by the very predictor of those
    runs (:func:`~deepjimu.cost.predict.staged.staged_step`, GPipe's order, with ``own``, the
    probed model's compute figures, and ``layers``, its blocks), by bisection for the one
    unknown, the runtime's work per action (the predicted step grows with it); a sharding
    strategy's per sharded unit alike (:func:`_unit_s`). A strategy the probe timed no step
    of (one rank, fewer blocks than ranks, a probe file of an earlier version) is left out."""
    out = {}
    for name, timed in found.steps.items():
        if entry(name).traits.shards_model:
            out[name] = _unit_s(cluster, found, cfg, own, layers, name, timed)
            continue
        if not entry(name).traits.splits_model or not timed.sizes:
            continue
        m = timed.microbatches
        probed = dataclasses.replace(
            cfg, model=found.model, strategy=name, schedule=Schedule.GPIPE, microbatches=m,
            workers=found.world, balance="even", emulate_speeds="",
        )  # fmt: skip
        staged = partial(staged_step, probed, layers, own, cluster, timed.sizes, timed.rows, m)
        out[name] = _solve_action(staged, timed.step_s)
    return out


def _unit_s(
    cluster: Cluster, found: Probe, cfg: RunConfig, own: Compute, layers: list[Layer],
    name: str, timed: TimedStep,
) -> float:  # fmt: skip
    """:attr:`Cluster.action_s` of a sharding strategy (``fsdp``, ``tp``): the seconds its
    DTensors' runtime adds per sharded unit and step, solved (:func:`_solve_action`) from
    the probe's step of the strategy itself on ``timed.rows`` a rank, as its own predictor
    predicts one batch of the probed model (``own``, ``layers``) with that much a unit."""
    world = found.world
    batch = timed.rows * (world if entry(name).traits.shards_data else 1)
    probed = dataclasses.replace(
        cfg, model=found.model, strategy=name, workers=world, batch_size=batch,
        balance="even", emulate_speeds="", compress="none", sync_plan="allreduce",
    )  # fmt: skip
    predictor = entry(name).predict
    assert predictor is not None

    def step(unit_s: float) -> Any:
        at = dataclasses.replace(cluster, action_s={**cluster.action_s, name: unit_s})
        return predictor(probed, layers, batch, own, at)

    return _solve_action(step, timed.step_s)


def _solve_action(staged: Callable[[float], Any], target: float) -> float:
    """The seconds per action at which the predicted step (``staged(action_s).step_s``,
    growing with it) takes ``target``, by bisection; 0 where the work alone already takes
    that long."""

    def step(action_s: float) -> float:
        return float(staged(action_s).step_s)

    if step(0.0) >= target:
        return 0.0
    lo, hi = 0.0, target  # every rank runs at least one action: step(target) > target
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) < target else (lo, mid)
    return (lo + hi) / 2


def _ddp_sync(
    cluster: Cluster, found: Probe, cfg: RunConfig, layers: list[Layer]
) -> dict[int, float]:
    """:attr:`Cluster.ddp_sync_s` of ``cluster``: what the probe's step of the data-parallel
    strategy over its own group (``found.steps``, the one whose entry shards the data) took
    beyond the same step of its ranks stepping together alone (``found.compute_s``, on the
    same cores at the same moment) and the all-reduce of the probed model's buckets that
    the fitted links predict; empty where the probe timed no such step (one rank, or a
    probe file of an earlier version)."""
    steps = [
        t
        for name, t in found.steps.items()
        if entry(name).traits.shards_data and not entry(name).traits.shards_model
    ]
    if not steps:
        return {}
    probed = dataclasses.replace(cfg, model=found.model, compress="none")
    comm_s, _ = ddp_comm(probed, layers, cluster, found.world)
    return {found.world: max(0.0, steps[0].step_s - found.compute_s - comm_s)}


def _alone(device: torch.device, threads: int) -> Cluster:
    """This machine for one worker on ``device`` computing on ``threads`` threads (on a CPU
    the cluster's cores: its one rank's threads are its cores): no link is used."""
    cores = available_cores() if device.type == "cpu" else None
    own = f", {threads} thread{'s' if threads > 1 else ''}" if cores and threads != cores else ""
    return Cluster(
        name=f"this machine ({device}" + (f", {cores} cores{own})" if cores else ")"),
        nodes=1,
        ranks_per_node=1,
        device=Device(str(device), {"fp32": 1.0}, 0),
        intra=Link(0.0, float("inf")),
        inter=None,
        cores_per_node=threads if cores else None,
        source="probe",
    )


def measure_again(made: dict[Any, Any]) -> None:
    """The rest of a plan's :data:`~deepjimu.measure.compute.ROUNDS`: every figure measured in
    this process once more per round, each model's in turn (so that a round of one
    configuration's figures runs beside a round of the others'); what was solved from the
    first round's figures (each probe's cluster) is dropped, to be solved again from the
    medians (the probes themselves are kept)."""
    computes = [
        kept[0]
        for kept in made.values()
        if isinstance(kept, tuple) and isinstance(kept[0], MeasuredCompute)
    ]
    for _ in range(ROUNDS - 1):
        for compute in computes:
            compute.again()
    for key in [k for k in made if isinstance(k, tuple) and k[0] == "cluster" and len(k) == 2]:
        del made[key]


def noisy_measurements(made: dict[Any, Any]) -> list[str]:
    """A line for each measurement of a plan (``made``: what :func:`cluster_and_compute`
    kept) whose repeated timings disagreed past their tolerance: the steps measured in this
    process, each probe's plain step (:func:`~deepjimu.cost.probe.noisy_repeats`)."""
    return [line for notes, _ in _timings(made) for line in notes]


def measured_spread(made: dict[Any, Any]) -> float:
    """The largest spread of the repeated timings a plan's predictions came from (``made``,
    as for :func:`noisy_measurements`); 0 for a plan on paper (nothing measured)."""
    return max([0.0, *(s for _, spreads in _timings(made) for s in spreads)])


def _timings(made: dict[Any, Any]) -> Iterator[tuple[list[str], list[float]]]:
    """Each repeated measurement ``made`` kept, as its noisy lines and its spreads: the steps
    measured in this process, each probe's plain step."""
    for kept in made.values():
        if isinstance(kept, tuple) and isinstance(kept[0], MeasuredCompute):
            yield kept[0].notes, kept[0].spreads
        elif isinstance(kept, Probe):
            noisy = kept.noisy_step()
            yield [noisy] if noisy else [], [relative_spread(kept.compute_rounds_s)]


def _model_figures(
    cfg: RunConfig, made: dict[Any, Any], cluster: Cluster | None, measured: bool
) -> tuple[Compute, list[Layer], int]:
    """The compute, blocks and training-set size of ``cfg``'s model (kept in ``made``)."""
    key = (
        cfg.model,
        cfg.dataset,
        cfg.data_dir,
        cfg.seed,
        cfg.optimizer,
        cfg.admm_readout,
        cfg.quantize,
    )
    if key not in made:
        # measured: the model runs here; on paper its shapes are enough
        model, data, layers = _layers_and_data(cfg, shapes=not measured)
        compute: Compute
        if measured:
            # timed where the runs train (--device): a GPU's plan from its own layer times
            device = pick_device(cfg, 0, 1)
            compute = MeasuredCompute(
                model.to(device), data.train_x.to(device), data.train_y.to(device), cfg
            )
        else:
            assert cluster is not None
            compute = AnalyticCompute(
                layers,
                cluster.device,
                str(cfg.precision),
                _admm_flops(model, data.feature_shape, cfg),
                _factors(model),
            )
        made[key] = (compute, layers, len(data.train_y))
    return made[key]  # type: ignore[no-any-return]
