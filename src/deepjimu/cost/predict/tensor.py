"""The predictor of tensor parallelism (``tp``): Megatron's Linear pairs, every rank on the whole batch, one all-reduce forward and one backward per pair."""

from __future__ import annotations

import math

from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster
from deepjimu.cost.predict.common import (
    FLOAT,
    Prediction,
    column,
    epoch_batches,
    slowdown,
    stages_of,
    threads_per_rank,
    workers_of,
)
from deepjimu.cost.profile import Compute, Layer

__all__ = ["pairs", "tensor_parallel"]


def pairs(n_blocks: int) -> list[tuple[int, int]]:
    """The blocks paired (columns, rows), one Linear each, in order; an odd last one is
    left whole on every rank.

    Example:
        >>> pairs(5)
        [(0, 1), (2, 3)]
    """
    return [(i, i + 1) for i in range(0, n_blocks - 1, 2)]


def tensor_parallel(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """Each rank's step on the whole batch with 1/P of every paired block's work, the
    pairs' all-reduces (forward: the row block's output; backward: the column block's
    input gradient, none for the first, whose input is the data) and what the DTensors'
    runtime adds per paired block (:attr:`Cluster.action_s`, solved from the probe's tp
    step), batch after batch. With ``--replicas R`` the pairs are cut over the K = P / R
    ranks of a replica, each replica steps on its part of the batch, and every block's
    shards move among the replicas as FSDP moves them (:func:`_replica_comm`; FSDP's runtime
    per unit as the probe's fsdp step priced it)."""
    p, k = workers_of(cfg), stages_of(cfg)
    t = threads_per_rank(cluster, p)
    slow = slowdown(cluster, p)
    paired = [b for pair in pairs(len(layers)) for b in pair]
    among, among_sent = _replica_comm(cfg, layers, cluster)
    runtime = len(paired) * cluster.action_s.get(cfg.strategy, 0.0)
    if cfg.replicas > 1:  # the sharding over the replicas' runtime (the registry's key)
        runtime += (len(layers) + 1) * cluster.action_s.get(f"{cfg.strategy}:replicas", 0.0)
    epoch, steps, compute_s, sent = 0.0, 0, 0.0, 0
    for whole, count in epoch_batches(train_size, cfg.batch_size):
        rows = math.ceil(whole / cfg.replicas)
        costs = compute.blocks(rows, t).costs()
        c = (compute.step(rows, t) - sum(costs[b] for b in paired) * (1 - 1 / k)) * slow
        messages = [rows * layers[b].out_elems * FLOAT for _, b in pairs(len(layers))]
        messages += [rows * layers[a].in_elems * FLOAT for a, _ in pairs(len(layers)) if a > 0]
        comm_s = sum(cluster.all_reduce_s(n, k) for n in messages) if k > 1 else 0.0
        penalty = cluster.sync_penalty_s(p) if p > 1 else 0.0
        epoch += count * (c + comm_s + among + runtime + penalty)
        steps += count
        compute_s += count * c
        sent += count * ((sum(messages) if k > 1 else 0) + among_sent)
    return Prediction(
        strategy=cfg.strategy,
        workers=p,
        step_s=epoch / steps,
        samples_per_s=train_size / epoch,
        bytes_per_sample=p * sent / train_size,
        parts={"compute_s": compute_s / steps},
    )


def _replica_comm(cfg: RunConfig, layers: list[Layer], cluster: Cluster) -> tuple[float, int]:
    """Seconds and bytes (one rank's payload) of a step's collectives among the replicas:
    each block's 1/R of a rank's part (1/K of a paired block, an unpaired one whole)
    all-gathered before its forward and again before its backward, its gradient
    reduce-scattered (a ring all-gather or reduce-scatter costs half the all-reduce of the
    whole); none without ``--replicas``."""
    r, k = cfg.replicas, stages_of(cfg)
    if r == 1:
        return 0.0, 0
    paired = {b for pair in pairs(len(layers)) for b in pair}
    ranks = column(cfg, 0)
    seconds, sent = 0.0, 0
    for b, layer in enumerate(layers):
        part = math.ceil(layer.params / (k if b in paired else 1))
        shard = math.ceil(part / r) * FLOAT
        seconds += 3 * cluster.all_reduce_over_s(r * shard, ranks) / 2
        sent += 2 * shard + r * shard
    return seconds, sent
