"""Sums over samples that a block's replicas pool (``--replicas``): pdADMM split over samples too.

The p, z, q and u updates are per sample; everything else a block computes over its samples
is a sum: the (W, b) step's statistics (``updates.pool_stats``), the start's RMS, the
readout's losses and accuracies, and, quantizing at 8 or 16 bits, the range of the grid
every exchanged tensor lies on (at 2 and 4 bits each sample has its own grid: nothing to
pool). With a :class:`Pool` (all-reduces among the ranks that hold the same block, one per
replica) each is taken over every replica's samples, so a block replicated R times
on N / R samples each runs the iteration of the 1-D run, up to the order of floating-point
sums. Without one (a 1-D run) each is computed as before, on this block's samples alone,
bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from deepjimu.admm_math import updates as U
from deepjimu.admm_math.wire import per_row
from deepjimu.comm import Comm, CommStats
from deepjimu.strategies.admm.layers import LayerOp

__all__ = ["Pool", "SelfPool", "mean", "means", "rms", "solve_Wb", "span", "stats", "stats_all"]


class Pool:
    """A block's replicas: a tensor summed, or its maximum taken, over them in place, by
    all-reduces on ``comm`` (the column's), counted as kind ``replicas``."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        # the data's pooled input statistics, with the data tensor they belong to (stats)
        self._inputs: tuple[Tensor, U.WbStats] | None = None

    def sum(self, t: Tensor) -> Tensor:
        return self.comm.all_reduce(t, kind="replicas")

    def max(self, t: Tensor) -> Tensor:
        return self.comm.all_reduce(t, kind="replicas", op=dist.ReduceOp.MAX)


class SelfPool(Pool):
    """A pool of one replica: the pooled code path without a message (every sum is the
    part's own), for timing a replicated block's work in one process."""

    def __init__(self) -> None:
        super().__init__(Comm(CommStats()))

    def sum(self, t: Tensor) -> Tensor:
        return t

    def max(self, t: Tensor) -> Tensor:
        return t


def stats_all(
    layers: Sequence[tuple[LayerOp, Tensor, Tensor, bool]], pool: Pool
) -> list[U.WbStats]:
    """The (W, b) statistics of several layers' samples (op, p, z, data), pooled over the
    replicas at once: two all-reduces in all (``updates.pool_stats``), not two a layer, so a
    block waits on its replicas twice an iteration. With ``data`` (p is the data, layer
    0's input, the same at every call with this tensor) the pooled statistics of p are made
    once and kept, and only z's are pooled at each call: n_out (n_in + 1) numbers move
    instead of adding n_in^2 (the 1-D run caches the data's Gram the same way), and a
    resumed run computes every step as the uninterrupted one did."""
    parts: list[U.WbStats | U.KnownInputs] = []
    for op, p, z, data in layers:
        rows, targets = op.wb_rows(p, z)
        if not data:
            parts.append(U.batch_stats(rows, targets))
            continue
        if pool._inputs is None or pool._inputs[0] is not p:
            (inputs,) = U.pool_stats([U.batch_stats(rows, targets[:, :0])], pool.sum)
            pool._inputs = (p, inputs)
        parts.append(U.KnownInputs(rows, targets, pool._inputs[1]))
    return U.pool_stats(parts, pool.sum)


def stats(op: LayerOp, p: Tensor, z: Tensor, pool: Pool | None, data: bool = False) -> U.WbStats:
    """The (W, b) statistics of the samples (p, z), pooled over the replicas
    (:func:`stats_all` of one layer)."""
    if pool is None:
        return U.batch_stats(*op.wb_rows(p, z))
    return stats_all([(op, p, z, data)], pool)[0]


def solve_Wb(
    op: LayerOp, p: Tensor, z: Tensor, W: Tensor, nu: float, pool: Pool | None, *,
    tau: float = 0.0, ridge: float = 0.0, gram: Tensor | None = None, data: bool = False,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``op``'s exact (W, b) step over the samples (p, z): its own solve (the smaller side,
    ``gram`` cached), or over every replica's samples from their pooled statistics
    (:func:`stats`; ``data``: p is the data)."""
    if pool is None:
        return op.solve_Wb(p, z, W, nu, tau=tau, ridge=ridge, gram=gram)
    return op.solve_Wb_stats(stats(op, p, z, pool, data), W, nu, tau=tau, ridge=ridge)


def mean(values: Tensor, pool: Pool | None) -> float:
    """The mean of ``values`` (one or more per sample) over every replica's samples."""
    if pool is None:
        return float(values.mean())
    return means([values], pool)[0]


def means(values: Sequence[Tensor], pool: Pool) -> list[float]:
    """The mean of each of ``values`` over every replica's entries, in one all-reduce (each
    collective is a point where the replicas wait for one another: a readout pools its fits
    at once)."""
    sums = [v.sum().double() for v in values]
    counts = [sums[0].new_tensor(float(v.numel())) for v in values]
    both = pool.sum(torch.stack([*sums, *counts]))
    k = len(values)
    return [float(both[i] / both[k + i]) for i in range(k)]


def rms(t: Tensor, pool: Pool | None) -> float:
    """The root mean square of ``t`` over every replica's samples."""
    if pool is None:
        return float(t.square().mean().sqrt())
    return mean(t.square(), pool) ** 0.5


def span(t: Tensor, pool: Pool | None, bits: int) -> tuple[Tensor, Tensor] | None:
    """The (min, max) of ``t`` over every replica's rows, float32, for the grid over the whole
    tensor at ``bits`` (8, 16). None in a 1-D run (the quantizer takes ``t``'s own) and for
    per-row grids (2, 4 bits: a row is a sample, which no other replica holds)."""
    if pool is None or per_row(bits):
        return None
    lo, hi = torch.aminmax(t.detach().to(torch.float32))
    both = pool.max(torch.stack([-lo, hi]))
    return -both[0], both[1]
