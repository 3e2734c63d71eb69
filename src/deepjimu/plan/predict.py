"""A predictor per strategy: one run's step time, samples/s, bytes per sample and memory on a cluster.

Every predictor composes the same two inputs, a :class:`~deepjimu.plan.profile.Compute`
(seconds of the model's work on one rank) and a :class:`~deepjimu.plan.cluster.Cluster`
(its links), by the strategy's schedule:

- ``local``: the measured step, batch after batch.
- ``ddp``: each rank's step on its ``batch / P`` rows, then the collectives of each DDP
  bucket (:mod:`deepjimu.plan.ddp`: the gradients in reverse order, the first bucket
  1 MiB, the others 25 MiB, as torch's DDP fills them). On a CPU node the all-reduce does not overlap the backward pass (gloo
  and the gradients share the cores, :mod:`deepjimu.compress.cost`); on a GPU it overlaps
  all but the last bucket's backward. ``--compress fp16|bf16`` halves the bytes and uses
  that dtype's fitted all-reduce; ``--sync-plan`` other than allreduce prices each tensor's
  method instead (:func:`sync_entries`).
- ``pipeline``: the schedule's actions (:func:`deepjimu.plan.schedule.actions`) replayed
  through the cost model (:func:`deepjimu.plan.schedule.simulate`) with each stage's
  micro-batch times and the cuts' transfers, then each rank's optimizer update of its
  own blocks.
- ``model-parallel``: the same with GPipe's order of one micro-batch: the stages one
  after the other on the whole batch, an activation and its gradient across each cut.
- ``admm``: per iteration the slowest rank's layers (ranks work at once), then the p and
  q exchange across each cut; per log the readout's forward chain, rank after rank.

Ranks that share a CPU node's cores slow each other down: a rank runs ``cores // P``
threads, and P ranks computing at once run :meth:`Cluster.ranks_sharing_cores` slower
(a pipeline's ranks, busy only part of the time, in proportion); ranks that synchronise on
time-shared cores lose :meth:`Cluster.sync_penalty_s` more at each synchronisation
(measured by the probe where it ran; not a model-parallel chain, whose ranks compute one at
a time), and a ddp step's all-reduce
:meth:`Cluster.ddp_sync_penalty_s` beyond its fitted time. DDP's own work comes from the compute figures
(measured here, or an estimate elsewhere); the pipelining runtime's work per action from
the probe's step of the pipeline strategy where a probe ran (:attr:`Cluster.action_s`),
else from the compute figures; a model-parallel hand-off's cost beyond the fitted send
likewise from the probe's model-parallel step. Samples per second mean what ``jimu
bench`` reports: training samples over training time (admm's start, once per run,
included over its ``--epochs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deepjimu.config import RunConfig
from deepjimu.data.base import shard_sizes
from deepjimu.plan.cluster import Cluster
from deepjimu.plan.ddp import buckets_of, message_s, messages
from deepjimu.plan.profile import Compute, KfacTimes, Layer
from deepjimu.plan.schedule import actions, simulate, stage_ranks
from deepjimu.plan.sync import SyncEntry, TensorInfo, plan_sync
from deepjimu.speeds import chosen_balance
from deepjimu.strategies.partition import listed_balance, parse_balance, partition

if TYPE_CHECKING:
    from deepjimu.kfac.assignment import WorkAssignment

__all__ = ["Prediction", "ddp_comm", "predict", "staged_step", "sync_entries", "threads_per_rank"]

_FLOAT = 4  # activations, gradients and admm's variables are float32


@dataclass(frozen=True)
class Prediction:
    """One configuration's predicted figures.

    ``step_s``: one training step (admm: one iteration, its share of the readout
    included); ``samples_per_s``: training samples over training time, as ``jimu bench``;
    ``bytes_per_sample``: bytes sent by all ranks per training sample; ``peak_mem_mb``: the
    model state one worker holds (weights, gradients, optimizer state, activations; admm:
    its variables), not the process's whole memory; ``parts``: the step's components.
    """

    strategy: str
    workers: int
    step_s: float
    samples_per_s: float
    bytes_per_sample: float
    peak_mem_mb: float
    parts: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """The ``predicted`` record of ``plan.json``."""
        return {
            "step_s": self.step_s,
            "samples_per_s": self.samples_per_s,
            "bytes_per_sample": self.bytes_per_sample,
            "peak_mem_mb": self.peak_mem_mb,
            "parts": self.parts,
        }


def _workers(cfg: RunConfig) -> int:
    """The run's worker count (a validated config has one)."""
    assert cfg.workers is not None, "config not resolved"
    return cfg.workers


def threads_per_rank(cluster: Cluster, p: int) -> int:
    """Threads of each of ``p`` ranks (:meth:`Cluster.threads_per_rank`; 1 on a GPU cluster)."""
    return cluster.threads_per_rank(p) or 1


def _slowdown(cluster: Cluster, p: int, busy: float | None = None) -> float:
    """How much slower each of ``p`` ranks computes when they run at once
    (:meth:`Cluster.ranks_sharing_cores`); where only ``busy`` of them compute at a time on
    average (a pipeline's bubbles), the slowdown in proportion."""
    full = cluster.ranks_sharing_cores(p)
    if busy is None:
        return full
    return 1.0 + (full - 1.0) * min(1.0, busy / p)


def _speeds(cfg: RunConfig, cluster: Cluster) -> tuple[list[float], bool]:
    """The run's ranks' speeds (:meth:`Cluster.rank_speeds`) and whether the run balances
    its work by them (``--balance`` resolved as the workers resolve it,
    :func:`deepjimu.speeds.chosen_balance`)."""
    speeds = cluster.rank_speeds(_workers(cfg))
    return speeds, chosen_balance(str(cfg.balance), speeds) == "speed"


def _shares(rows: int, speeds: list[float], by_speed: bool) -> list[int]:
    """Each rank's rows of a batch of ``rows``: in proportion to its speed (as the workers
    shard by it, :func:`~deepjimu.data.base.shard_sizes`), or an equal share."""
    return shard_sizes(rows, speeds) if by_speed else [math.ceil(rows / len(speeds))] * len(speeds)


def predict(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """The prediction for ``cfg`` (a validated config: strategy, workers, batch, ...).

    Args:
        cfg: the run (its ``strategy``, ``workers`` and the options its strategy reads).
        layers: the model's blocks (:func:`deepjimu.plan.measure.layers_of`).
        train_size: training samples per epoch.
        compute: seconds of the model's work on one rank.
        cluster: the ranks' links (and cores, on a CPU node).

    Raises:
        ValueError: a strategy or option the planner does not predict.
    """
    assert cfg.workers is not None
    p = _workers(cfg)
    if p > cluster.world:
        raise ValueError(f"{p} workers on a cluster of {cluster.world} ranks")
    kind = cfg.strategy
    if str(cfg.optimizer) == "kfac" and kind in ("local", "ddp"):
        return _kfac(cfg, layers, train_size, compute, cluster)
    if kind == "local":
        return _gradient(cfg, layers, train_size, compute, cluster, comm=None)
    if kind == "ddp" and cfg.sync_plan != "allreduce":

        def sync_comm(cfg: RunConfig, layers: list[Layer], c: Cluster, p: int) -> tuple[float, int]:
            entries = sync_entries(cfg, layers, compute, c, p)
            return sum(e.seconds for e in entries), sum(e.nbytes for e in entries)

        return _gradient(cfg, layers, train_size, compute, cluster, comm=sync_comm)
    if kind == "ddp":
        return _gradient(cfg, layers, train_size, compute, cluster, comm=ddp_comm)
    if kind == "model-parallel":
        return _model_parallel(cfg, layers, train_size, compute, cluster)
    if kind == "pipeline":
        return _pipeline(cfg, layers, train_size, compute, cluster)
    if kind == "admm":
        return _admm(cfg, train_size, compute, cluster)
    raise ValueError(f"the planner does not predict strategy {kind}")


def _batches(train_size: int, batch: int) -> list[tuple[int, int]]:
    """(rows, count) of an epoch's batches: ceil(N / batch) nearly equal ones, as the
    strategies cut an epoch (``strategies.base.split_steps``)."""
    steps = math.ceil(train_size / batch)
    small, extra = divmod(train_size, steps)
    return [(small + 1, extra)] * bool(extra) + [(small, steps - extra)]


def _state_mb(cfg: RunConfig, params: int, rows: int, activations: int) -> float:
    """Weights, gradients, optimizer state (Adam 2, SGD's momentum 1 copy) and the forward's
    activations kept for the backward pass, in MB."""
    copies = 2 + (2 if cfg.optimizer == "adam" else 1)
    return (copies * params + 2 * rows * activations) * _FLOAT / 1e6


_Comm = Callable[[RunConfig, list[Layer], Cluster, int], tuple[float, int]]
"""A step's communication: (seconds, bytes one rank hands to collectives)."""


def ddp_comm(cfg: RunConfig, layers: list[Layer], cluster: Cluster, p: int) -> tuple[float, int]:
    """Seconds and bytes (one rank's payload) of one step's collectives (:mod:`deepjimu.plan.ddp`)."""
    compress = str(cfg.compress)
    if compress not in ("none", "fp16", "bf16"):
        # the other compressors' encode/decode time is measured by jimu probe, per model
        raise ValueError(
            f"the planner predicts ddp with --compress none, fp16 or bf16 (compress: {compress}); "
            "jimu probe predicts the others for its model"
        )
    shapes = [s for layer in layers for s in layer.param_shapes]
    msgs = messages(compress, buckets_of(shapes))
    return sum(message_s(cluster, c, b, p) for c, b in msgs), sum(b for _, b in msgs)


def sync_entries(
    cfg: RunConfig, layers: list[Layer], compute: Compute, cluster: Cluster, p: int
) -> list[SyncEntry]:
    """ddp's ``--sync-plan`` for the model of ``layers`` on ``cluster`` (:mod:`deepjimu.plan.sync`).

    Without data to measure, a sparse embedding is taken to touch every distinct id of its
    first sample in every row of the batch (at most all its rows: an upper bound, since
    real batches repeat ids), its rows handed to gloo's own sparse all-reduce on a CPU
    cluster (``TensorInfo.native``), and the rebuild of a Linear's sufficient factors to cost
    half its block's backward pass on the other ranks' rows (the weight-gradient matmul of
    the two that a Linear's backward makes).
    """
    rows = math.ceil(cfg.batch_size / p)
    native = (
        cluster.cores_per_node is not None
    )  # CPU nodes run gloo, GPUs NCCL (no sparse all-reduce)
    tensors = []
    for layer in layers:
        kinds = layer.kinds or ("dense",) * len(layer.param_shapes)
        per_sample = layer.rows or (0.0,) * len(layer.param_shapes)
        for j, (shape, kind, r) in enumerate(
            zip(layer.param_shapes, kinds, per_sample, strict=True)
        ):
            name = f"{layer.name}.{j}"
            if kind == "embedding":
                touched = min(shape[0], r * rows)
                tensors.append(TensorInfo(name, shape, kind, rows=touched, native=native))
            elif kind == "linear":
                rebuild = 0.0
                if p > 1:
                    t = threads_per_rank(cluster, p)
                    block = layers.index(layer)
                    rebuild = compute.blocks(rows * (p - 1), t).bwd_s[block] / 2
                tensors.append(TensorInfo(name, shape, kind, rows=r * rows, rebuild_s=rebuild))
            else:
                tensors.append(TensorInfo(name, shape))
    return plan_sync(tensors, cfg.sync_plan, cluster, p)


def _gradient(
    cfg: RunConfig,
    layers: list[Layer],
    train_size: int,
    compute: Compute,
    cluster: Cluster,
    comm: _Comm | None,
) -> Prediction:
    """``local`` (``comm`` None) and ``ddp``: every rank steps on its share of each batch."""
    p = _workers(cfg)
    t = threads_per_rank(cluster, p)
    slow = _slowdown(cluster, p)
    comm_s, sent = comm(cfg, layers, cluster, p) if comm is not None and p > 1 else (0.0, 0)

    def step_of(rows: int, t: int) -> float:
        # DDP adds work to the plain step: a ddp step measured below it is the noise of
        # two separate timings, and the plain step is the better figure
        if comm is None:
            return compute.step(rows, t)
        return max(compute.ddp_step(rows, t), compute.step(rows, t))

    speeds, by_speed = _speeds(cfg, cluster)
    epoch, steps, compute_s = 0.0, 0, 0.0
    for rows, count in _batches(train_size, cfg.batch_size):
        # each rank's rows: an equal share, or one in proportion to its speed; the slowest
        # rank's step sets the pace
        shares = _shares(rows, speeds, by_speed)
        c = max(step_of(r, t) / v for r, v in zip(shares, speeds, strict=True)) * slow
        if cluster.cores_per_node is None and comm_s:  # a GPU overlaps all but the last bucket
            bwd = sum(compute.blocks(math.ceil(rows / p), t).bwd_s)
            hidden = bwd * (1 - layers[0].params / max(1, sum(l.params for l in layers)))
            step = c + max(0.0, comm_s - hidden)
        else:
            step = c + comm_s
        if comm is not None:
            step += cluster.sync_penalty_s(p) + cluster.ddp_sync_penalty_s(p)
        epoch += count * step
        steps += count
        compute_s += count * c
    return _replicated(cfg, layers, train_size, epoch, steps, compute_s, comm_s, sent)


def _replicated(
    cfg: RunConfig, layers: list[Layer], train_size: int, epoch: float, steps: int,
    compute_s: float, comm_s: float, sent: int,
) -> Prediction:  # fmt: skip
    """The prediction of a strategy whose every rank holds the whole model (``local``,
    ``ddp``, K-FAC on them) from an epoch's seconds and steps, the compute of those
    steps, a step's communication and the bytes one rank hands to it per step."""
    assert cfg.workers is not None
    p = _workers(cfg)
    params = sum(l.params for l in layers)
    rows = math.ceil(cfg.batch_size / p)
    return Prediction(
        strategy=cfg.strategy,
        workers=p,
        step_s=epoch / steps,
        samples_per_s=train_size / epoch,
        bytes_per_sample=p * sent * steps / train_size,
        peak_mem_mb=_state_mb(cfg, params, rows, sum(l.out_elems for l in layers)),
        parts={"compute_s": compute_s / steps, "comm_s": comm_s},
    )


def _stage_sizes(
    cfg: RunConfig, costs: list[float], layers: list[Layer], k: int, cluster: Cluster
) -> list[int]:
    """Blocks per stage as the strategy splits them (``--balance``; by speed, stage s on
    rank s % P)."""
    speeds, by_speed = _speeds(cfg, cluster)
    if by_speed:
        return partition(costs, k, [speeds[s % len(speeds)] for s in range(k)])
    if cfg.balance in ("time", "even", "auto", "speed"):
        return partition(costs, k)
    if cfg.balance == "size":
        return partition([float(l.params) for l in layers], k)
    return parse_balance(cfg.balance, len(layers), k)


def _cuts(sizes: list[int]) -> list[int]:
    """The block after which each stage ends (but the last)."""
    out, at = [], 0
    for s in sizes[:-1]:
        at += s
        out.append(at - 1)
    return out


def _loss_s(compute: Compute, rows: int, t: int, n_blocks: int) -> float:
    """A step's work beyond the blocks' forward and backward and the optimizer's update:
    the loss and its gradient, on ``rows`` rows."""
    return max(
        0.0,
        compute.step(rows, t)
        - sum(compute.blocks(rows, t).costs())
        - compute.update(0, n_blocks, t),
    )


@dataclass(frozen=True)
class _Staged:
    """One step of a split model (``model-parallel``, ``pipeline``): its seconds, its
    replayed schedule, each stage's (first block, blocks) and the bytes it sends."""

    step_s: float
    makespan_s: float
    bubble: float
    sent: int
    parts: dict[str, float] = field(default_factory=dict)


def staged_step(
    cfg: RunConfig, layers: list[Layer], compute: Compute, cluster: Cluster,
    sizes: list[int], rows: int, m: int, action_s: float,
) -> _Staged:  # fmt: skip
    """A split model's step: its schedule's actions (``model-parallel``: GPipe's order with
    one micro-batch) replayed with each stage's forward and backward on ``rows`` rows (plus
    ``action_s``, the runtime's own work per action), the loss in the last stage's
    backward and each cut's hand-offs; then each rank's optimizer update of its own blocks
    once its last action ended (an update costs mostly per call and per tensor, so the
    rank that finishes last pays its own, not a share of the model's)."""
    p = _workers(cfg)
    chunks = 2 if cfg.strategy == "pipeline" and str(cfg.schedule) == "interleaved" else 1
    schedule = str(cfg.schedule) if cfg.strategy == "pipeline" else "gpipe"
    t = threads_per_rank(cluster, p)
    times = compute.blocks(rows, t)
    starts = _starts(sizes)
    stage_rank = stage_ranks(p, chunks)
    rank_speed = cluster.rank_speeds(p)
    speed = [rank_speed[r] for r in stage_rank]  # each stage's rank's
    fwd = [
        (sum(times.fwd_s[a : a + s]) + action_s) / v
        for (a, s), v in zip(starts, speed, strict=True)
    ]
    bwd = [
        (sum(times.bwd_s[a : a + s]) + action_s) / v
        for (a, s), v in zip(starts, speed, strict=True)
    ]
    bwd[-1] += _loss_s(compute, rows, t, len(layers)) / speed[-1]
    ends = [a + s - 1 for a, s in starts]

    def send(a: int, b: int) -> float:
        nbytes = rows * layers[ends[min(a, b)]].out_elems * _FLOAT
        return cluster.p2p_s(nbytes, stage_rank[a], stage_rank[b])

    sim = simulate(actions(schedule, p, m, chunks), fwd, bwd, send, stage_rank)
    finish = max(
        max((span.end_s for span in sim.spans[r]), default=0.0)
        + sum(
            compute.update(*starts[s], t) / speed[s]
            for s in range(len(starts))
            if stage_rank[s] == r
        )
        for r in range(p)
    )
    busy = sum(sim.busy_s) / sim.makespan_s if sim.makespan_s else 1.0
    # ranks that compute at once on time-shared cores lose the penalty once a step; a chain
    # of one micro-batch has one rank computing at a time, and its hand-offs' cost beyond
    # the fitted send is in its action time (solved from the probe's model-parallel step:
    # with the ddp step's penalty, model-parallel x2-x3 came out 13-35% too slow)
    slow = _slowdown(cluster, p, busy)
    penalty = cluster.sync_penalty_s(p) if m > 1 else 0.0
    step = finish * slow + penalty
    sent = sum(2 * m * rows * layers[e].out_elems * _FLOAT for e in ends[:-1])
    parts = {"finish_s": finish, "slowdown": slow, "sync_s": penalty}
    return _Staged(step, sim.makespan_s, sim.bubble_fraction, sent, parts)


def _model_parallel(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """Stages one after the other on the whole batch; activations and gradients cross each cut."""
    p = _workers(cfg)
    t = threads_per_rank(cluster, p)
    sizes = _stage_sizes(cfg, compute.blocks(cfg.batch_size, t).costs(), layers, p, cluster)
    epoch, steps, sent = 0.0, 0, 0
    action = cluster.action_s.get("model-parallel", 0.0)  # a hand-off's cost beyond its send
    for rows, count in _batches(train_size, cfg.batch_size):
        one = staged_step(cfg, layers, compute, cluster, sizes, rows, 1, action)
        epoch += count * one.step_s
        steps += count
        sent += count * one.sent
    params = max(sum(l.params for l in layers[a : a + s]) for a, s in _starts(sizes))
    return Prediction(
        strategy=cfg.strategy,
        workers=p,
        step_s=epoch / steps,
        samples_per_s=train_size / epoch,
        bytes_per_sample=sent / train_size,
        peak_mem_mb=_state_mb(cfg, params, cfg.batch_size, max(l.out_elems for l in layers)),
        parts={"stages": float(p), **one.parts},
    )


def _starts(sizes: list[int]) -> list[tuple[int, int]]:
    out, at = [], 0
    for s in sizes:
        out.append((at, s))
        at += s
    return out


def _pipeline(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """The schedule's actions replayed with each stage's micro-batch times (see the module docstring).

    Every micro-batch has the rows of the largest batch's largest micro-batch (the strategy
    pads the others to it), so every step costs the same.
    """
    p, m = _workers(cfg), cfg.microbatches
    chunks = 2 if str(cfg.schedule) == "interleaved" else 1
    t = threads_per_rank(cluster, p)
    steps = math.ceil(train_size / cfg.batch_size)
    r = math.ceil(math.ceil(train_size / steps) / m)
    sizes = _stage_sizes(cfg, compute.blocks(r, t).costs(), layers, p * chunks, cluster)
    # each action pays the pipelining runtime's own work besides its blocks
    action = cluster.action_s.get("pipeline")
    if action is None:
        action = compute.pipeline_action(r, m, t)
    one = staged_step(cfg, layers, compute, cluster, sizes, r, m, action)
    params = max(sum(l.params for l in layers[a : a + s]) for a, s in _starts(sizes))
    return Prediction(
        strategy=cfg.strategy,
        workers=p,
        step_s=one.step_s,
        samples_per_s=train_size / (steps * one.step_s),
        bytes_per_sample=one.sent * steps / train_size,
        peak_mem_mb=_state_mb(cfg, params, r * m, max(l.out_elems for l in layers)),
        parts={"makespan_s": one.makespan_s, "bubble": one.bubble, **one.parts},
    )


def _admm(cfg: RunConfig, train_size: int, compute: Compute, cluster: Cluster) -> Prediction:
    """Full-batch pdADMM: ranks solve their layers at once, then exchange p and q at each cut."""
    if cfg.admm_batch:
        raise ValueError(
            f"the planner predicts full-batch admm only (admm-batch: {cfg.admm_batch})"
        )
    assert cfg.workers is not None and cfg.epochs is not None
    p = _workers(cfg)
    t = threads_per_rank(cluster, p)
    a = compute.admm(train_size, t)
    L = len(a.layer_s)
    speeds, by_speed = _speeds(cfg, cluster)
    if listed_balance(cfg.balance):
        sizes = parse_balance(cfg.balance, L, p)
    else:
        sizes = partition(a.costs, p, speeds if by_speed else None)
    slow = _slowdown(cluster, p)
    ranks, chain_factor = _admm_rank_s(a.layer_s, sizes, speeds, slow)
    exchange, chain, sent = _admm_traffic(cfg, train_size, a.widths, sizes, cluster)
    # three synchronisations: the p and q exchanges, the readout's choice
    iteration = max(ranks) + 2 * exchange + 3 * cluster.sync_penalty_s(p)
    readout = (a.readout_s * chain_factor + chain) / cfg.eval_every
    step = iteration + readout
    # the start (a forward chain and the backward sweeps, rank after rank) once per run
    start = a.start_s * chain_factor + chain
    mem = max(
        sum(train_size * (3 * a.widths[l]) * _FLOAT for l in range(s, s + k))
        for s, k in _starts(sizes)
    )
    return Prediction(
        strategy=cfg.strategy,
        workers=p,
        step_s=step,
        samples_per_s=cfg.epochs * train_size / (cfg.epochs * step + start),
        bytes_per_sample=sent / train_size,
        peak_mem_mb=mem / 1e6,
        parts={
            "compute_s": max(ranks),
            "exchange_s": 2 * exchange,
            "readout_s": readout,
            "start_s": start,
        },
    )


def _admm_rank_s(
    layer_s: list[float], sizes: list[int], speeds: list[float], slow: float
) -> tuple[list[float], float]:
    """Each rank's seconds of an iteration's layers (at its speed, ``slow`` times slower for
    sharing cores), and the factor that turns the one-process time of a chain over all
    layers into that chain's time across the ranks."""
    ranks = [
        sum(layer_s[s : s + k]) * slow / v for (s, k), v in zip(_starts(sizes), speeds, strict=True)
    ]
    # the readout and the start run rank after rank: each rank its layers, at its speed
    total = sum(layer_s) or 1.0
    chain_factor = sum(
        sum(layer_s[s : s + k]) / total / v
        for (s, k), v in zip(_starts(sizes), speeds, strict=True)
    )
    return ranks, chain_factor


def _admm_traffic(
    cfg: RunConfig, train_size: int, widths: list[int], sizes: list[int], cluster: Cluster
) -> tuple[float, float, float]:
    """Across the cuts between ranks: the seconds of one p (or q) exchange, of the readout's
    forward chain, and the bytes sent per iteration (its share of the readout included)."""
    rank_of = [r for r, s in enumerate(sizes) for _ in range(s)]
    cuts = _cuts(sizes)
    word = cfg.quantize / 8 if cfg.quantize else _FLOAT
    exchange = max(
        (
            cluster.p2p_s(int(train_size * widths[c] * word), rank_of[c], rank_of[c + 1])
            for c in cuts
        ),
        default=0.0,
    )
    # the readout's forward chain (the plain and the refitted activations) runs rank after rank
    chain = sum(
        2 * cluster.p2p_s(train_size * widths[c] * _FLOAT, rank_of[c], rank_of[c + 1]) for c in cuts
    )
    sent = sum(2 * train_size * widths[c] * word for c in cuts)
    sent += sum(2 * train_size * widths[c] * _FLOAT for c in cuts) / cfg.eval_every
    return exchange, chain, sent


def _kfac(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """K-FAC on ``local`` or ``ddp`` (KAISA): each rank's step on its rows, the gradients'
    all-reduce, the factors' all-reduce every ``--kfac-factor-every`` steps, and every
    ``--kfac-inv-every`` steps the decompositions, split over the ranks by the strategy's
    own :class:`~deepjimu.kfac.assignment.WorkAssignment` (the slowest rank's share counts)
    and broadcast within each gradient-worker group; with fewer gradient workers than ranks
    the preconditioned gradients are broadcast too."""
    assert cfg.workers is not None
    p = _workers(cfg)
    t = threads_per_rank(cluster, p)
    slow = _slowdown(cluster, p)
    grad_s, grad_bytes = ddp_comm(cfg, layers, cluster, p) if p > 1 else (0.0, 0)
    speeds, by_speed = _speeds(cfg, cluster)
    epoch, steps, compute_s = 0.0, 0, 0.0
    for rows, count in _batches(train_size, cfg.batch_size):
        step, c = _kfac_step(
            cfg, rows, compute, cluster, p, t, slow, speeds, by_speed, grad_s, grad_bytes
        )
        epoch += count * step
        steps += count
        compute_s += count * c
    return _replicated(cfg, layers, train_size, epoch, steps, compute_s, grad_s, grad_bytes)


def _kfac_step(
    cfg: RunConfig,
    rows: int,
    compute: Compute,
    cluster: Cluster,
    p: int,
    t: int,
    slow: float,
    speeds: list[float],
    by_speed: bool,
    grad_s: float,
    grad_bytes: int,
) -> tuple[float, float]:
    """One K-FAC step of a batch of ``rows`` (see :func:`_kfac`): its seconds, and the
    seconds of its compute alone (``p`` ranks of ``t`` threads, ``slow`` the cores' sharing)."""
    from deepjimu.kfac.assignment import WorkAssignment, decomposition_cost

    # each rank's rows (in proportion to its speed where the run balances by it); the
    # slowest rank's step sets the pace
    shares = _shares(rows, speeds, by_speed)
    k = compute.kfac(max(shares), t)
    step_s = max(compute.kfac(r, t).step_s / v for r, v in zip(shares, speeds, strict=True))
    costs = [decomposition_cost(a, g) for a, g in zip(k.n_a, k.n_g, strict=True)]
    workers = max(1, round(cfg.kfac_grad_workers * p))
    assignment = WorkAssignment.greedy(costs, p, workers, speeds if by_speed else None)
    decompose = max(
        load / v for load, v in zip(assignment.loads(k.decompose_s), speeds, strict=True)
    )
    triangles = sum(a * (a + 1) // 2 + g * (g + 1) // 2 for a, g in zip(k.n_a, k.n_g, strict=True))
    factors = cluster.all_reduce_s(triangles * _FLOAT, p) if p > 1 else 0.0
    bcast = _decompositions_bcast_s(cfg, k, assignment, cluster, p, workers)
    # with fewer gradient workers than ranks, each row's gradient workers broadcast their
    # preconditioned gradients to the row: every gradient once, one broadcast per column
    row = p // workers
    grads = (
        assignment.columns * _broadcast_s(cluster, grad_bytes // assignment.columns, row)
        if row > 1
        else 0.0
    )
    c = step_s * slow
    step = (
        c
        + cluster.sync_penalty_s(p)
        + grad_s
        + grads
        + factors / cfg.kfac_factor_every
        + (decompose * slow + bcast) / cfg.kfac_inv_every
    )
    return step, c


def _decompositions_bcast_s(
    cfg: RunConfig,
    k: KfacTimes,
    assignment: WorkAssignment,
    cluster: Cluster,
    p: int,
    workers: int,
) -> float:
    """Seconds to broadcast the layers' decompositions from their inverse workers within
    each gradient-worker group (``workers`` gradient workers of ``p`` ranks)."""
    from deepjimu.kfac.precondition import METHODS

    kind = METHODS[cfg.kfac_method]
    sizes = [kind.numel(a, g) * _FLOAT for a, g in zip(k.n_a, k.n_g, strict=True)]
    # each inverse worker broadcasts its layers' decompositions in its column, one
    # broadcast after the other; the columns at once: the slowest column counts
    owned = [
        sum(b for b, r in zip(sizes, assignment.inv_workers, strict=True) if r == src)
        for src in range(p)
    ]
    return max(
        (
            sum(_broadcast_s(cluster, owned[r], workers) for r in col if owned[r])
            for col in assignment.worker_groups()
        ),
        default=0.0,
    )


def _broadcast_s(cluster: Cluster, nbytes: int, ranks: int) -> float:
    """One broadcast of ``nbytes`` to ``ranks`` ranks, pipelined along a chain: a hop's latency
    per further rank, the bytes once over a hop's bandwidth."""
    if ranks < 2:
        return 0.0
    hop = cluster.hop("all_gather", ranks)
    return (ranks - 1) * hop.alpha_s + nbytes / hop.bytes_per_s
