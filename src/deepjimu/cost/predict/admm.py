"""The predictor of full-batch pdADMM: ranks solve their layers at once, then exchange p and q at each cut."""

from __future__ import annotations

import math

from deepjimu.admm_math.wire import wire_bytes
from deepjimu.balance import listed_balance, parse_balance, partition
from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster
from deepjimu.cost.predict.common import (
    FLOAT,
    Prediction,
    balanced_speeds,
    column,
    cut_after,
    slowdown,
    stage_starts,
    stages_of,
    threads_per_rank,
    workers_of,
)
from deepjimu.cost.profile import Compute, Layer

__all__ = ["layer_parallel"]


def layer_parallel(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """Full-batch pdADMM: ranks solve their layers at once, then exchange p and q at each cut
    (its layers' work is pdADMM's own, ``compute.admm``: ``layers`` give only the (W, b)
    shapes). With ``--replicas R`` each replica's chain does this on its N / R samples, all
    at once, and each rank's (W, b) statistics are all-reduced among its replicas
    (:func:`_pooled_s`)."""
    if cfg.admm_batch:
        raise ValueError(
            f"the planner predicts full-batch admm only (admm-batch: {cfg.admm_batch})"
        )
    assert cfg.workers is not None and cfg.epochs is not None
    p, w = stages_of(cfg), workers_of(cfg)
    t = threads_per_rank(cluster, w)
    n = math.ceil(train_size / cfg.replicas)  # the largest replica's samples
    a = compute.admm(n, t, pooled=cfg.replicas > 1)
    L = len(a.layer_s)
    speeds, by_speed = balanced_speeds(cfg, cluster)
    if listed_balance(cfg.balance):
        sizes = parse_balance(cfg.balance, L, p)
    else:
        sizes = partition(a.costs, p, speeds if by_speed else None)
    slow = slowdown(cluster, w)
    ranks, chain_factor = _admm_rank_s(a.layer_s, sizes, speeds, slow)
    exchange, chain, sent = _admm_traffic(cfg, n, a.widths, sizes, cluster)
    sent *= cfg.replicas
    pooled, pooled_readout, pooled_bytes, readout_syncs = _pooled_s(cfg, layers, sizes, cluster)
    sent += pooled_bytes * (1 + 1 / cfg.eval_every)
    # three synchronisations: the p and q exchanges, the readout's choice; with replicas,
    # two more, the iteration's pooled sums, and each of the readout's pooled sums one
    penalty = cluster.sync_penalty_s(w)
    syncs = 3 + (2 if cfg.replicas > 1 else 0)
    iteration = max(ranks) + 2 * exchange + pooled + syncs * penalty
    readout = a.readout_s * chain_factor + chain + pooled_readout + readout_syncs * penalty
    readout /= cfg.eval_every
    step = iteration + readout
    # the start (a forward chain and the backward sweeps, rank after rank) once per run
    start = a.start_s * chain_factor + chain
    return Prediction(
        strategy=cfg.strategy,
        workers=w,
        step_s=step,
        samples_per_s=cfg.epochs * train_size / (cfg.epochs * step + start),
        bytes_per_sample=sent / train_size,
        parts={
            "compute_s": max(ranks),
            "exchange_s": 2 * exchange,
            "readout_s": readout,
            "start_s": start,
            "replicas_s": pooled,
        },
    )


def _pooled_s(
    cfg: RunConfig, layers: list[Layer], sizes: list[int], cluster: Cluster
) -> tuple[float, float, float, int]:
    """With ``--replicas``: the seconds of an iteration's and of a readout's all-reduces among
    each rank's replicas (the slowest rank's), the bytes all ranks hand to an iteration's,
    and the most all-reduces a rank's readout makes (each a synchronisation of its column)
    (``strategies.admm.pooled``: per layer the means and count, then C_pp and C_zp; the
    data's C_pp once for the run). An iteration pools all of a rank's layers at once: two
    all-reduces. A readout refits them one after another, two each, and the block that
    ends the network two more (the classifier refitted on the iterate's features) and one
    (the fits' losses and accuracy); a readout moves about an iteration's bytes. Every
    all-reduce pays its link's latency: on a loopback gloo ring about 1 ms, which a readout
    of 4 layers on one rank pays 11 times."""
    if cfg.replicas == 1:
        return 0.0, 0.0, 0.0, 0
    iteration, readout, sent, count = [], [], 0.0, 0
    for r, (start, k) in enumerate(stage_starts(sizes)):
        ranks = column(cfg, r)
        heads, moments, refits = 0, 0, []  # refits: the readout's all-reduces, in floats
        for l in range(start, start + k):
            shape = layers[l].param_shapes[0]  # W: [n_out, n_in] (a conv's: [C_out, C_in, s, s])
            n_out, n_in = shape[0], math.prod(shape[1:])
            head = n_out if l == 0 else n_in + n_out + 1
            moment = n_out * n_in if l == 0 else n_in * (n_in + n_out)
            heads, moments = heads + head, moments + moment
            refits += [head, moment]
            sent += cfg.replicas * (head + moment) * FLOAT
        if start + k == len(layers):  # the classifier's refit, and the fits
            refits += [head, moment, 8]
        iteration.append(
            cluster.all_reduce_over_s(heads * FLOAT, ranks)
            + cluster.all_reduce_over_s(moments * FLOAT, ranks)
        )
        readout.append(sum(cluster.all_reduce_over_s(f * FLOAT, ranks) for f in refits))
        count = max(count, len(refits))
    return max(iteration), max(readout), sent, count


def _admm_rank_s(
    layer_s: list[float], sizes: list[int], speeds: list[float], slow: float
) -> tuple[list[float], float]:
    """Each rank's seconds of an iteration's layers (at its speed, ``slow`` times slower for
    sharing cores), and the factor that turns the one-process time of a chain over all
    layers into that chain's time across the ranks."""
    ranks = [
        sum(layer_s[s : s + k]) * slow / v
        for (s, k), v in zip(stage_starts(sizes), speeds, strict=True)
    ]
    # the readout and the start run rank after rank: each rank its layers, at its speed
    total = sum(layer_s) or 1.0
    chain_factor = sum(
        sum(layer_s[s : s + k]) / total / v
        for (s, k), v in zip(stage_starts(sizes), speeds, strict=True)
    )
    return ranks, chain_factor


def _admm_traffic(
    cfg: RunConfig, train_size: int, widths: list[int], sizes: list[int], cluster: Cluster
) -> tuple[float, float, float]:
    """Across the cuts between ranks: the seconds of one p (or q) exchange, of the readout's
    forward chain, and the bytes sent per iteration (its share of the readout included).

    Every message, the readout's too, is one tensor of ``train_size`` rows as the exchange
    sends it (``wire.wire_bytes``: float32, or ``--quantize``'s codes and grid headers)."""
    rank_of = [r for r, s in enumerate(sizes) for _ in range(s)]
    cuts = cut_after(sizes)
    message = {c: wire_bytes(train_size, widths[c], cfg.quantize) for c in cuts}
    exchange = max(
        (cluster.p2p_s(message[c], rank_of[c], rank_of[c + 1]) for c in cuts), default=0.0
    )
    # the readout's forward chain (the plain and the refitted activations) runs rank after rank
    chain = sum(2 * cluster.p2p_s(message[c], rank_of[c], rank_of[c + 1]) for c in cuts)
    # p left and q right each iteration, the readout's two passes right at each log
    sent = sum(2 * message[c] for c in cuts) * (1 + 1 / cfg.eval_every)
    return exchange, chain, float(sent)
