"""The predictor of tensor parallelism (``tp``): Megatron's Linear pairs, every rank on the whole batch, one all-reduce forward and one backward per pair."""

from __future__ import annotations

from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster
from deepjimu.cost.predict.common import (
    FLOAT,
    Prediction,
    epoch_batches,
    slowdown,
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
    step), batch after batch."""
    p = workers_of(cfg)
    t = threads_per_rank(cluster, p)
    slow = slowdown(cluster, p)
    paired = [b for pair in pairs(len(layers)) for b in pair]
    epoch, steps, compute_s, sent = 0.0, 0, 0.0, 0
    for rows, count in epoch_batches(train_size, cfg.batch_size):
        costs = compute.blocks(rows, t).costs()
        c = (compute.step(rows, t) - sum(costs[b] for b in paired) * (1 - 1 / p)) * slow
        messages = [rows * layers[b].out_elems * FLOAT for _, b in pairs(len(layers))]
        messages += [rows * layers[a].in_elems * FLOAT for a, _ in pairs(len(layers)) if a > 0]
        comm_s = sum(cluster.all_reduce_s(n, p) for n in messages) if p > 1 else 0.0
        runtime = len(paired) * cluster.action_s.get(cfg.strategy, 0.0)
        epoch += count * (c + comm_s + runtime + (cluster.sync_penalty_s(p) if p > 1 else 0.0))
        steps += count
        compute_s += count * c
        sent += count * (sum(messages) if p > 1 else 0)
    return Prediction(
        strategy=cfg.strategy,
        workers=p,
        step_s=epoch / steps,
        samples_per_s=train_size / epoch,
        bytes_per_sample=p * sent / train_size,
        parts={"compute_s": compute_s / steps},
    )
