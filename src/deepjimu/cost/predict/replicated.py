"""Predictors of the strategies whose every rank holds the whole model: one process, and data parallel (with K-FAC on either)."""

from __future__ import annotations

import math
from collections.abc import Callable

from deepjimu.choices import Optimizer
from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster
from deepjimu.cost.ddp import GRAD_BYTES, buckets_of, message_s, messages
from deepjimu.cost.predict.common import (
    FLOAT,
    Prediction,
    balanced_speeds,
    column,
    epoch_batches,
    row_shares,
    slowdown,
    stages_of,
    threads_per_rank,
    workers_of,
)
from deepjimu.cost.profile import Compute, KfacTimes, Layer
from deepjimu.cost.sync import TRIAL_MARGIN, SyncEntry, TensorInfo, plan_sync
from deepjimu.kfac.assignment import WorkAssignment, decomposition_cost, packed_numel

__all__ = [
    "data_parallel",
    "ddp_comm",
    "fsdp_comm",
    "fully_sharded",
    "one_process",
    "sync_choice",
    "sync_entries",
]

_Comm = Callable[[RunConfig, list[Layer], Cluster, int], tuple[float, int]]
"""A step's communication: (seconds, bytes one rank hands to collectives)."""


def ddp_comm(cfg: RunConfig, layers: list[Layer], cluster: Cluster, p: int) -> tuple[float, int]:
    """Seconds and bytes (one rank's payload) of one step's collectives (:mod:`deepjimu.cost.ddp`)."""
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


def fsdp_comm(cfg: RunConfig, layers: list[Layer], cluster: Cluster, p: int) -> tuple[float, int]:
    """Seconds and bytes (one rank's payload) of one fsdp step's collectives: per block, its
    parameters' shards all-gathered before its forward and again before its backward, and
    its gradients reduce-scattered (float32, ``ceil(n / p)`` entries a shard). With
    ``--replicas R`` (HSDP) the blocks are sharded over the p / R ranks of a replica, and
    each gradient shard is then all-reduced among the R replicas."""
    k, replicas = stages_of(cfg), column(cfg, 0)
    seconds, sent = 0.0, 0
    for layer in layers:
        shard = math.ceil(layer.params / k) * GRAD_BYTES
        seconds += 2 * cluster.all_gather_s(shard, k) + cluster.reduce_scatter_s(k * shard, k)
        seconds += cluster.all_reduce_over_s(shard, replicas)
        sent += 2 * shard + k * shard + (shard if len(replicas) > 1 else 0)
    return seconds, sent


def fully_sharded(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """Fully sharded data parallel (``fsdp``): each rank's plain step on its share of each
    batch, then each block's all-gathers and reduce-scatter (:func:`fsdp_comm`) and what
    FSDP's runtime adds per unit (each block and the root: :attr:`Cluster.action_s`, solved
    from the probe's fsdp step); a rank holds 1/P of the weights, gradients and optimizer
    state, and one block whole at a time."""
    units = len(layers) + 1
    return _gradient(
        cfg, layers, train_size, compute, cluster, comm=fsdp_comm, plain=True, units=units
    )


def sync_entries(
    cfg: RunConfig, layers: list[Layer], compute: Compute, cluster: Cluster, p: int
) -> list[SyncEntry]:
    """ddp's ``--sync-plan`` for the model of ``layers`` on ``cluster`` (:mod:`deepjimu.cost.sync`).

    Without data to measure, a sparse embedding is taken to touch every distinct id of its
    first sample in every row of the batch (at most all its rows: an upper bound, since
    real batches repeat ids), its rows handed to gloo's own sparse all-reduce on a CPU
    cluster (``TensorInfo.native``), and the rebuild of a Linear's sufficient factors to cost
    half its block's backward pass on the other ranks' rows (the weight-gradient matmul of
    the two that a Linear's backward makes).
    """
    rows = math.ceil(cfg.batch_size / p)
    native = not cluster.gpus  # CPU nodes run gloo, GPUs NCCL (no sparse all-reduce)
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


def one_process(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """One process (``local``): the measured step, batch after batch; K-FAC's with
    ``--optimizer kfac``."""
    if cfg.optimizer == Optimizer.KFAC:
        return _kfac(cfg, layers, train_size, compute, cluster)
    return _gradient(cfg, layers, train_size, compute, cluster, comm=None)


def data_parallel(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> Prediction:
    """Data parallel (``ddp``): each rank's step on its share of the batch, then the
    gradients' all-reduce (:func:`ddp_comm`), or each tensor's method of ``--sync-plan``
    (:func:`sync_entries`); K-FAC's with ``--optimizer kfac``."""
    if cfg.optimizer == Optimizer.KFAC:
        return _kfac(cfg, layers, train_size, compute, cluster)
    return sync_choice(cfg, layers, train_size, compute, cluster)[0]


def sync_choice(
    cfg: RunConfig, layers: list[Layer], train_size: int, compute: Compute, cluster: Cluster
) -> tuple[Prediction, str]:
    """ddp's prediction under ``--sync-plan``, and what it trains with: ``"DDP"`` (torch's
    DistributedDataParallel: ``allreduce``, or an ``auto`` plan not predicted faster than it
    by more than :data:`~deepjimu.cost.sync.TRIAL_MARGIN`, as the run's own trial would keep
    DDP) or ``"plan"``."""
    ddp = _gradient(cfg, layers, train_size, compute, cluster, comm=ddp_comm)
    if cfg.sync_plan == "allreduce":
        return ddp, "DDP"

    def sync_comm(cfg: RunConfig, layers: list[Layer], c: Cluster, p: int) -> tuple[float, int]:
        entries = sync_entries(cfg, layers, compute, c, p)
        return sum(e.seconds for e in entries), sum(e.nbytes for e in entries)

    planned = _gradient(cfg, layers, train_size, compute, cluster, comm=sync_comm)
    if cfg.sync_plan == "auto" and planned.step_s >= ddp.step_s * (1 - TRIAL_MARGIN):
        return ddp, "DDP"
    return planned, "plan"


def _gradient(
    cfg: RunConfig,
    layers: list[Layer],
    train_size: int,
    compute: Compute,
    cluster: Cluster,
    comm: _Comm | None,
    plain: bool = False,
    units: int = 0,
) -> Prediction:
    """``local`` (``comm`` None), ``ddp`` and ``fsdp`` (``plain``: its ranks' steps are the
    plain step, without DDP's buckets; ``units``: its sharded units, each paying the
    runtime's :attr:`Cluster.action_s` a step): every rank steps on its share of each batch."""
    p = workers_of(cfg)
    t = threads_per_rank(cluster, p)
    slow = slowdown(cluster, p)
    comm_s, sent = comm(cfg, layers, cluster, p) if comm is not None and p > 1 else (0.0, 0)

    def step_of(rows: int, t: int) -> float:
        # DDP adds work to the plain step: a ddp step measured below it is the noise of
        # two separate timings, and the plain step is the better figure
        if comm is None or plain:
            return compute.step(rows, t)
        return max(compute.ddp_step(rows, t), compute.step(rows, t))

    speeds, by_speed = balanced_speeds(cfg, cluster, p)  # every rank takes its rows
    epoch, steps, compute_s = 0.0, 0, 0.0
    for rows, count in epoch_batches(train_size, cfg.batch_size):
        # each rank's rows: an equal share, or one in proportion to its speed; the slowest
        # rank's step sets the pace
        shares = row_shares(rows, speeds, by_speed)
        c = max(step_of(r, t) / v for r, v in zip(shares, speeds, strict=True)) * slow
        if cluster.gpus and comm_s:  # a GPU overlaps all but the last bucket
            bwd = sum(compute.blocks(math.ceil(rows / p), t).bwd_s)
            hidden = bwd * (1 - layers[0].params / max(1, sum(l.params for l in layers)))
            step = c + max(0.0, comm_s - hidden)
        else:
            step = c + comm_s
        if comm is not None:
            step += cluster.sync_penalty_s(p) + (0.0 if plain else cluster.ddp_sync_penalty_s(p))
        step += units * cluster.action_s.get(cfg.strategy, 0.0)
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
    p = workers_of(cfg)
    return Prediction(
        strategy=cfg.strategy,
        workers=p,
        step_s=epoch / steps,
        samples_per_s=train_size / epoch,
        bytes_per_sample=p * sent * steps / train_size,
        parts={"compute_s": compute_s / steps, "comm_s": comm_s},
    )


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
    p = workers_of(cfg)
    t = threads_per_rank(cluster, p)
    slow = slowdown(cluster, p)
    grad_s, grad_bytes = ddp_comm(cfg, layers, cluster, p) if p > 1 else (0.0, 0)
    speeds, by_speed = balanced_speeds(cfg, cluster, p)  # every rank takes its rows
    epoch, steps, compute_s = 0.0, 0, 0.0
    for rows, count in epoch_batches(train_size, cfg.batch_size):
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
    # each rank's rows (in proportion to its speed where the run balances by it); the
    # slowest rank's step sets the pace
    shares = row_shares(rows, speeds, by_speed)
    k = compute.kfac(max(shares), t)
    step_s = max(compute.kfac(r, t).step_s / v for r, v in zip(shares, speeds, strict=True))
    costs = [decomposition_cost(a, g) for a, g in zip(k.n_a, k.n_g, strict=True)]
    workers = max(1, round(cfg.kfac_grad_workers * p))
    assignment = WorkAssignment.greedy(costs, p, workers, speeds if by_speed else None)
    decompose = max(
        load / v for load, v in zip(assignment.loads(k.decompose_s), speeds, strict=True)
    )
    triangles = sum(a * (a + 1) // 2 + g * (g + 1) // 2 for a, g in zip(k.n_a, k.n_g, strict=True))
    factors = cluster.all_reduce_s(triangles * FLOAT, p) if p > 1 else 0.0
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
    sizes = [packed_numel(cfg.kfac_method, a, g) * FLOAT for a, g in zip(k.n_a, k.n_g, strict=True)]
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
