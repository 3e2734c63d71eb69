"""Predictors of the strategies that split the model into stages: a chain of one batch, and a pipeline of micro-batches."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from deepjimu.balance import parse_balance, partition
from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster
from deepjimu.cost.predict.common import (
    FLOAT,
    Prediction,
    balanced_speeds,
    column,
    epoch_batches,
    slowdown,
    stage_starts,
    stages_of,
    threads_per_rank,
    workers_of,
)
from deepjimu.cost.profile import Compute, Layer
from deepjimu.cost.schedule import actions, simulate, stage_ranks

__all__ = ["chain", "pipelined", "staged_step"]


def _stage_sizes(
    cfg: RunConfig, costs: list[float], layers: list[Layer], k: int, cluster: Cluster
) -> list[int]:
    """Blocks per stage as the strategy splits them (``--balance``; by speed, stage s on
    rank s % P)."""
    speeds, by_speed = balanced_speeds(cfg, cluster)
    if by_speed:
        return partition(costs, k, [speeds[s % len(speeds)] for s in range(k)])
    if cfg.balance in ("time", "even", "auto", "speed"):
        return partition(costs, k)
    if cfg.balance == "size":
        return partition([float(l.params) for l in layers], k)
    return parse_balance(cfg.balance, len(layers), k)


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
    sizes: list[int], rows: int, m: int, action_s: float, schedule: str = "gpipe",
    chunks: int = 1,
) -> _Staged:  # fmt: skip
    """A split model's step: the actions of ``schedule`` with ``m`` micro-batches and
    ``chunks`` stages a rank (a chain: GPipe's order with one micro-batch) replayed with
    each stage's forward and backward on ``rows`` rows (plus
    ``action_s``, the runtime's own work per action), the loss in the last stage's
    backward and each cut's hand-offs; then each rank's optimizer update of its own blocks
    once its last action ended (an update costs mostly per call and per tensor, so the
    rank that finishes last pays its own, not a share of the model's).

    With ``--replicas R`` this is one replica's chain of p = workers / R ranks on its
    ``rows`` (all R chains run at once, sharing the nodes' cores), then each rank's stage
    gradients all-reduced among its R replicas (torch's DDP over the stage's column: on a
    CPU node after the backward, as ddp's own step; the bytes are its payload)."""
    p, w = stages_of(cfg), workers_of(cfg)
    t = threads_per_rank(cluster, w)
    times = compute.blocks(rows, t)
    starts = stage_starts(sizes)
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
        nbytes = rows * layers[ends[min(a, b)]].out_elems * FLOAT
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
    replicas = cfg.replicas
    slow = slowdown(cluster, w, busy * replicas)
    penalty = cluster.sync_penalty_s(w) if m > 1 or replicas > 1 else 0.0
    sent = replicas * sum(2 * m * rows * layers[e].out_elems * FLOAT for e in ends[:-1])
    column_s, grad_bytes = _columns(cfg, layers, compute, cluster, starts, stage_rank, rows)
    sent += replicas * grad_bytes
    step = finish * slow + penalty + column_s
    parts = {"finish_s": finish, "slowdown": slow, "sync_s": penalty, "replicas_s": column_s}
    return _Staged(step, sim.makespan_s, sim.bubble_fraction, sent, parts)


def _columns(
    cfg: RunConfig, layers: list[Layer], compute: Compute, cluster: Cluster,
    starts: list[tuple[int, int]], stage_rank: list[int], rows: int,
) -> tuple[float, int]:  # fmt: skip
    """With ``--replicas``: the seconds a step waits for its stages' gradients all-reduced
    among their replicas, and the bytes one replica's ranks hand to those all-reduces
    (0, 0 without replicas)."""
    if cfg.replicas == 1:
        return 0.0, 0
    p, w = stages_of(cfg), workers_of(cfg)
    t = threads_per_rank(cluster, w)
    grads = [
        sum(layers[b].params for s in range(len(starts)) if stage_rank[s] == r
            for b in range(starts[s][0], starts[s][0] + starts[s][1])) * FLOAT
        for r in range(p)
    ]  # fmt: skip
    # torch's DDP's own work (its hooks copying gradients into buckets), the measured
    # ddp step's beyond the plain one, each rank's in proportion to its parameters,
    # and what a ddp all-reduce loses beyond its fitted time where ranks share cores
    extra = max(0.0, compute.ddp_step(rows, t) - compute.step(rows, t)) / max(1, sum(grads))
    # a stage's DDP all-reduces in its last backward, before the gradient of its input goes
    # to the stage before (torch's pipelining and model-parallel's chain alike): the chain's
    # last backward waits for each stage's in turn. Checked on 4 ranks, 2 x 2, mlp:256x3:
    # model-parallel predicted 9% too slow; pipeline's DDP cost 2-3 ms a step measured
    # (its runs without DDP), 3.6 ms predicted
    seconds = sum(
        cluster.all_reduce_over_s(g, column(cfg, r)) + extra * g for r, g in enumerate(grads)
    )
    return seconds + cluster.ddp_sync_penalty_s(w), sum(grads)


def chain(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """Stages one after the other on the whole batch (a replica's part of it, with
    ``--replicas``); activations and gradients cross each cut."""
    p, replicas = stages_of(cfg), cfg.replicas
    t = threads_per_rank(cluster, workers_of(cfg))
    sizes = _stage_sizes(cfg, compute.blocks(cfg.batch_size, t).costs(), layers, p, cluster)
    epoch, steps, sent = 0.0, 0, 0
    action = cluster.action_s.get(cfg.strategy, 0.0)  # a hand-off's cost beyond its send
    for rows, count in epoch_batches(train_size, cfg.batch_size):
        part = math.ceil(rows / replicas)  # the largest replica's part sets the pace
        one = staged_step(cfg, layers, compute, cluster, sizes, part, 1, action)
        epoch += count * one.step_s
        steps += count
        sent += count * one.sent
    return Prediction(
        strategy=cfg.strategy,
        workers=workers_of(cfg),
        step_s=epoch / steps,
        samples_per_s=train_size / epoch,
        bytes_per_sample=sent / train_size,
        parts={"stages": float(p), **one.parts},
    )


def pipelined(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """The schedule's actions replayed with each stage's micro-batch times (see the module docstring).

    Every micro-batch has the rows of the largest batch's largest micro-batch (the strategy
    pads the others to it), so every step costs the same.
    """
    p, m = stages_of(cfg), cfg.microbatches
    chunks = 2 if str(cfg.schedule) == "interleaved" else 1
    t = threads_per_rank(cluster, workers_of(cfg))
    steps = math.ceil(train_size / cfg.batch_size)
    # the largest replica's part of the largest batch, cut into m micro-batches
    r = math.ceil(math.ceil(math.ceil(train_size / steps) / cfg.replicas) / m)
    sizes = _stage_sizes(cfg, compute.blocks(r, t).costs(), layers, p * chunks, cluster)
    # each action pays the pipelining runtime's own work besides its blocks
    action = cluster.action_s.get(cfg.strategy)
    if action is None:
        action = compute.pipeline_action(r, m, t)
    one = staged_step(cfg, layers, compute, cluster, sizes, r, m, action, str(cfg.schedule), chunks)
    return Prediction(
        strategy=cfg.strategy,
        workers=workers_of(cfg),
        step_s=one.step_s,
        samples_per_s=train_size / (steps * one.step_s),
        bytes_per_sample=one.sent * steps / train_size,
        parts={"makespan_s": one.makespan_s, "bubble": one.bubble, **one.parts},
    )
