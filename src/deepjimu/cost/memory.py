"""Each rank's memory, predicted from the model's shapes alone: what a strategy puts on each worker.

A model's :class:`~deepjimu.cost.profile.Layer` list (sizes, no tensors: the model may be
built on the meta device) and the run's options give each rank's *training state*: the
weights, gradients and optimizer state it holds, the activations its backward pass keeps
and a strategy's own buffers (DDP's gradient buckets, FSDP's unsharded block, a
pipeline's micro-batches in flight, pdADMM's per-sample variables). One function per
kind of split; the registry names which a strategy uses (``Entry.memory``). A worker's
whole peak adds the process's base (:func:`worker_peak`): on a CPU the interpreter,
torch and its data; on a GPU the allocator counts tensors only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from deepjimu.balance import listed_balance, parse_balance, partition
from deepjimu.choices import Optimizer
from deepjimu.config import RunConfig
from deepjimu.cost.predict.common import stage_starts
from deepjimu.cost.predict.tensor import pairs
from deepjimu.cost.profile import Layer

__all__ = [
    "BASE_BYTES",
    "IN_PROCESS_BYTES",
    "RUNTIME_BYTES",
    "MemoryModel",
    "admm_state",
    "fsdp_state",
    "replicated_state",
    "staged_state",
    "tensor_state",
    "transients",
    "with_whole_model",
    "worker_peak",
]

FLOAT = 4

BASE_BYTES = 235 * 2**20
"""A CPU worker's resident memory when it starts: the interpreter and torch, loaded
before it joins a ``--memory-limit`` group (which does not count it). With
:data:`RUNTIME_BYTES`, the peak RSS (VmHWM) of ``jimu train --model mlp:16x2 --epochs 1``
workers on digits (torch 2.13, CPU: 313-315 MB for ddp and model-parallel); what a
strategy's workers hold beyond it is its entry's ``Traits.base_mb``."""

IN_PROCESS_BYTES = 74 * 2**20
"""What a run of one worker holds beyond a spawned worker's base, where it runs in the
launcher's own process (which read the data set whole and validated the run): 389 MB
measured (VmHWM) for a one-process run of ``--model mlp:16x2 --epochs 1`` on digits."""

RUNTIME_BYTES = 80 * 2**20
"""What a CPU worker allocates once started beyond its model's state: its process group,
data shard, threads and the allocator's arenas. Measured as the memory cgroup's usage of
those workers under ``--memory-limit`` (78-127 MB, 78 once training)."""

MemoryModel = Callable[[RunConfig, list[Layer], int], list[float]]
"""Each rank's training state in bytes, from the run's config, the model's blocks and the
training-set size."""


def _optimizer_copies(cfg: RunConfig) -> int:
    """Copies of the weights the optimizer keeps: Adam's two moments, SGD's momentum."""
    return 2 if cfg.optimizer == Optimizer.ADAM else 1


def _workers(cfg: RunConfig) -> int:
    assert cfg.workers is not None, "config not resolved"
    return cfg.workers


def _stages(cfg: RunConfig) -> int:
    """The ranks of one replica (``--replicas R``: workers / R)."""
    return _workers(cfg) // cfg.replicas


def _weights(cfg: RunConfig, params: float) -> float:
    """Weights, gradients and optimizer state of ``params`` elements."""
    return (2 + _optimizer_copies(cfg)) * params * FLOAT


def _activations(rows: float, layers: Sequence[Layer]) -> float:
    """What the backward pass keeps of ``layers``' forward on ``rows`` rows (each block's
    input and output), and the gradient of the widest."""
    kept = sum(l.in_elems + l.out_elems for l in layers)
    widest = max((l.out_elems for l in layers), default=0)
    return rows * (kept + widest) * FLOAT


def replicated_state(cfg: RunConfig, layers: list[Layer], train_size: int) -> list[float]:
    """The whole model on every rank, each on its share of a batch (one process, ddp); with
    several ranks DDP's gradient buckets hold one more copy of the gradients."""
    p = _workers(cfg)
    params = sum(l.params for l in layers)
    buckets = params * FLOAT if p > 1 else 0
    rows = math.ceil(cfg.batch_size / p)
    return [_weights(cfg, params) + buckets + _activations(rows, layers)] * p


def fsdp_state(cfg: RunConfig, layers: list[Layer], train_size: int) -> list[float]:
    """1/P of the weights, gradients and optimizer state; one block unsharded at a time
    (its weights, and its gradients before the reduce-scatter: a step's transients) and the
    next one's weights gathered ahead; the activations of a rank's share of the batch. On a
    CPU, as the strategy has glibc return what it frees (``memory.return_freed_memory``).
    With ``--replicas`` (HSDP) 1/K of the state, K = P / R the ranks of a replica."""
    p, k = _workers(cfg), _stages(cfg)
    params = sum(l.params for l in layers)
    blocks = sorted((l.params for l in layers), reverse=True)
    whole = (2 * blocks[0] + (blocks[1] if len(blocks) > 1 else 0)) * FLOAT if blocks else 0
    rows = math.ceil(cfg.batch_size / p)
    return [_weights(cfg, math.ceil(params / k)) + whole + _activations(rows, layers)] * p


def tensor_state(cfg: RunConfig, layers: list[Layer], train_size: int) -> list[float]:
    """Megatron's pairs: 1/P of each paired block, the unpaired ones whole; every rank on
    the whole batch. With ``--replicas R``: the pairs cut over the K = P / R ranks of a
    replica, every block's part then sharded over the replicas (FSDP: 1/R of it held, one
    block's part gathered at a time, as :func:`fsdp_state`), activations of a replica's
    part of the batch."""
    p, k, r = _workers(cfg), _stages(cfg), cfg.replicas
    paired = {b for pair in pairs(len(layers)) for b in pair}
    parts = [math.ceil(l.params / (k if b in paired else 1)) for b, l in enumerate(layers)]
    rows = math.ceil(cfg.batch_size / r)
    if r == 1:
        return [_weights(cfg, sum(parts)) + _activations(rows, layers)] * p
    ordered = sorted(parts, reverse=True)
    whole = (2 * ordered[0] + (ordered[1] if len(ordered) > 1 else 0)) * FLOAT
    own = sum(math.ceil(n / r) for n in parts)
    return [_weights(cfg, own) + whole + _activations(rows, layers)] * p


def stage_sizes(cfg: RunConfig, layers: list[Layer], stages: int) -> list[int]:
    """Blocks per stage as a split strategy cuts them, from the blocks' FLOPs (a listed
    ``--balance`` as given; ``size`` by parameters)."""
    if listed_balance(str(cfg.balance)):
        return parse_balance(str(cfg.balance), len(layers), stages)
    if cfg.balance == "size":
        return partition([float(l.params) for l in layers], stages)
    return partition([l.fwd_flops or float(l.params) or 1.0 for l in layers], stages)


def staged_state(cfg: RunConfig, layers: list[Layer], train_size: int) -> list[float]:
    """Each rank its stages' blocks (model-parallel, pipeline): their weights and the
    activations of the rows in flight: the whole batch for a chain and for GPipe, which
    keeps every micro-batch until its backward; under 1F1B a stage keeps at most as many
    micro-batches as stages follow it. With ``--replicas R`` each replica's ranks alike, on
    its part of the batch."""
    p = _stages(cfg)
    sizes = stage_sizes(cfg, layers, min(p, len(layers)))
    m = int(cfg.microbatches or 1)
    batch = math.ceil(cfg.batch_size / cfg.replicas)
    out = [0.0] * p
    held: list[list[Layer]] = [[] for _ in range(p)]  # each rank's blocks
    for s, (start, k) in enumerate(stage_starts(sizes)):
        own = layers[start : start + k]
        held[s % p] += own
        rows = float(batch)
        if m > 1 and str(cfg.schedule) != "gpipe":
            rows = min(m, len(sizes) - s) * batch / m
        out[s % p] += _weights(cfg, sum(l.params for l in own)) + _activations(rows, own)
    return [o + transients(h) for o, h in zip(out, held, strict=True)] * cfg.replicas


def with_whole_model(
    states: list[float], layers: list[Layer], kept: bool, timed: bool = False, parts: bool = False
) -> list[float]:
    """A split or sharded strategy's ranks, with the whole model they were built from: a
    worker builds the whole ``nn.Sequential`` first (where the run balances by speed, each
    steps it one block at a time, within its own transients), unless it builds in ``parts``
    (``registry.builds_in_parts``: each block drawn in turn, kept, loaded into the rank's
    shards or freed at once: one block beside the rank's part, within its step's
    transients). A split model's rank then frees the other ranks' blocks (its part alone
    after that); a sharded model's (``kept``) holds the whole beside its shards while it
    copies them. Where the split follows the blocks' measured times (``timed``), rank 0
    times a copy of each block and its gradients beside the model first."""
    whole = 0 if parts else sum(l.params for l in layers) * FLOAT
    out = [max(whole, whole + s if kept else s) for s in states]
    if timed and out:
        out[0] = max(out[0], whole + transients(layers))
    return out


def _admm_cost(n: int, layer: Layer, first: bool) -> float:
    """One pdADMM iteration's FLOPs of a dense layer, as the strategy estimates them to
    split its layers (``strategies.admm.layers.DenseOp.flops``): the (W, b) step solved on
    the smaller of the samples and the input width, and the p-step but for the first."""
    n_in, n_out = layer.in_elems, layer.out_elems
    side = min(n, n_in)
    c = n * (2 * n_in * n_out + n_in * side) + side**3 / 3
    return c if first else c + 2 * n * n_in * n_out + n_in**3 / 3


def admm_state(cfg: RunConfig, layers: list[Layer], train_size: int) -> list[float]:
    """pdADMM's blocks, split by their estimated cost as the strategy splits them: per layer
    its weights, for every training sample (or a mini-batch's) its p, q, z and u (four
    floats a unit of its width), and the square matrices of its exact solves (the (W, b)
    step's Gram matrix and factor on the smaller of samples and input width, the p-step's
    matrix and cached inverse on the input width, but for the first layer). With
    ``--replicas R`` each replica's ranks alike, on its N / R samples, their (W, b) steps
    solved on the input side (the pooled statistics)."""
    p = _stages(cfg)
    n = math.ceil(int(cfg.admm_batch or train_size) / cfg.replicas)
    pooled = cfg.replicas > 1
    costs = [_admm_cost(n, l, i == 0) for i, l in enumerate(layers)]
    sizes = (
        parse_balance(str(cfg.balance), len(layers), p)
        if listed_balance(str(cfg.balance))
        else partition(costs, min(p, len(layers)))
    )
    # momentum (on unless --admm-momentum 0) keeps each variable's last value but p's
    m = 0 if cfg.admm_momentum == 0 else 1
    out = [0.0] * p
    for r, (start, k) in enumerate(stage_starts(sizes)):
        for i in range(start, start + k):
            l = layers[i]
            n_in, n_out = l.in_elems, l.out_elems
            squares = 3 * (n_in if pooled else min(n, n_in)) ** 2
            if i > 0:  # the p-step solves on the smaller side: its system, factor, a temporary
                # and the solved map (updates.update_p: M, out x in, or H^-1, in x in)
                squares += 3 * min(n_in, n_out) ** 2 + (l.params if n_out <= n_in else n_in**2)
            out[r] += ((2 + m) * l.params + (4 + 3 * m) * n * n_out + squares) * FLOAT
    return out * cfg.replicas


def transients(layers: Sequence[Layer]) -> float:
    """What a step allocates and frees beside the state: the backward's gradient and the
    optimizer's temporaries of the largest parameter block (of a stage's rank: of its own
    blocks, in its state; admm's every rank, whose workspaces follow the widest layer, its
    own or a neighbour's: measured, not derived), twice its size (measured: one
    process of mlp:4096x2 on digits peaked 190 MB, 2.8 of its 16.8M-parameter layers,
    above its state)."""
    return 2 * max((l.params for l in layers), default=0) * FLOAT


def worker_peak(state: float, base: float, data_bytes: int, cuda: bool, whole: bool) -> int:
    """A worker's predicted peak: its training state; on a CPU its runtime
    (:data:`RUNTIME_BYTES`) and, for the ``whole`` process (its RSS), the ``base`` it
    started with and the data set it maps; a GPU's allocator counts tensors alone."""
    if cuda:
        return round(state)
    return round(state + RUNTIME_BYTES + (base + data_bytes if whole else 0))
