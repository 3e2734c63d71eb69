"""What the predictors know of a model: its blocks' sizes, and the seconds its work takes on a device.

A *profile* is split in two. :class:`Layer` holds what does not depend on the device
(forward FLOPs, parameters, activation sizes per sample). A :class:`Compute` answers
"how long does this work take here": each block's forward and backward on ``rows``
rows with ``threads`` threads (:class:`BlockTimes`), a whole plain training step, the optimizer's update of a run of
blocks (a stage's), and
one pdADMM iteration's per-layer work (:class:`AdmmTimes`). On the machine we run on the
answers are measured (:class:`deepjimu.measure.compute.MeasuredCompute`); for a device that
is not here, :class:`AnalyticCompute` scales FLOPs by the device's peak and efficiency.
Predictors (:mod:`deepjimu.cost.predict`) only see this interface, so they can be
checked against hand-made figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from deepjimu.cost.cluster import Device

__all__ = [
    "LAUNCH_S",
    "RUNTIME_S",
    "AdmmTimes",
    "AnalyticCompute",
    "BlockTimes",
    "Compute",
    "KfacTimes",
    "Layer",
]

LAUNCH_S = 10e-6
"""Seconds a GPU kernel costs beyond its FLOPs (launch and a small kernel's floor): a few
microseconds each, and a block runs a few kernels."""

RUNTIME_S = 100e-6
"""Seconds of host work that torch's DDP adds to a step, and torch.distributed.pipelining
to each action, on a device that is not here: an estimate (on the 2-core VM, measured, they
are 0.3-1 ms)."""


@dataclass(frozen=True)
class Layer:
    """One block of the model's ``nn.Sequential``, per sample: forward FLOPs, parameters
    (elements), input and output activation elements; ``shapes`` the shapes of its
    parameters (model order; empty: one flat tensor of ``params``). For the sync planner
    (:mod:`deepjimu.cost.sync`), per parameter: ``kinds`` (``dense``, ``linear``,
    ``embedding``; empty: all dense) and ``rows`` (a Linear weight's input rows per
    sample; a sparse embedding's distinct ids per sample, which bounds the rows a batch
    touches)."""

    name: str
    fwd_flops: float
    params: int
    in_elems: int
    out_elems: int
    shapes: tuple[tuple[int, ...], ...] = ()
    kinds: tuple[str, ...] = ()
    rows: tuple[float, ...] = ()

    @property
    def param_shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.shapes or ((self.params,),)


@dataclass(frozen=True)
class BlockTimes:
    """Forward and backward seconds of each block on ``rows`` rows with ``threads`` threads."""

    rows: int
    threads: int
    fwd_s: list[float]
    bwd_s: list[float]

    def costs(self) -> list[float]:
        """Forward + backward of each block (what ``--balance time`` partitions)."""
        return [f + b for f, b in zip(self.fwd_s, self.bwd_s, strict=True)]


@dataclass(frozen=True)
class AdmmTimes:
    """One full-batch pdADMM iteration over ``rows`` samples: each layer's seconds (its p,
    (W, b), z, q, u updates and extrapolation), the readout's seconds (each log runs it),
    each layer's FLOP estimate (what the strategy partitions by) and output width (elements
    per sample of the q and p that cross a boundary after it); ``start_s`` the run's start
    on one worker (the forward pass that sets every variable and the backward sweeps), a
    chain that no rank shares."""

    rows: int
    threads: int
    layer_s: list[float]
    readout_s: float
    costs: list[float]
    widths: list[int]
    start_s: float = 0.0


@dataclass(frozen=True)
class KfacTimes:
    """One K-FAC step on ``rows`` rows in one process: ``step_s`` a step that decomposes
    nothing (forward, backward, the batch factors when due, preconditioning, SGD's update),
    ``decompose_s`` each layer's decomposition (every ``--kfac-inv-every`` steps), and each
    layer's factor sizes ``n_a``, ``n_g``."""

    rows: int
    threads: int
    step_s: float
    decompose_s: list[float]
    n_a: list[int]
    n_g: list[int]


class Compute(Protocol):
    """Seconds of a model's work on one rank's device."""

    def blocks(self, rows: int, threads: int) -> BlockTimes: ...

    def step(self, rows: int, threads: int) -> float: ...

    def update(self, first: int, count: int, threads: int) -> float: ...

    def admm(self, rows: int, threads: int, pooled: bool = False) -> AdmmTimes: ...

    def kfac(self, rows: int, threads: int) -> KfacTimes: ...

    def ddp_step(self, rows: int, threads: int) -> float: ...

    def pipeline_action(self, rows: int, m: int, threads: int) -> float: ...


@dataclass(frozen=True)
class AnalyticCompute:
    """Compute of a device that is not here: FLOPs over the device's sustained rate.

    A block's forward takes ``rows * fwd_flops / rate + LAUNCH_S``, its backward twice the
    FLOPs; a step adds the optimizer's update, one pass over the parameters per block
    (``LAUNCH_S`` each). pdADMM's per-layer seconds are its FLOP estimates over the rate
    (``admm_flops(rows)``: per layer FLOPs and output widths), its readout the (W, b) refits
    of every layer. ``threads`` is ignored: a GPU is one device whatever the host's threads.
    """

    layers: list[Layer]
    device: Device
    precision: str = "fp32"
    admm_flops: Callable[[int], tuple[list[float], list[float], list[int]]] | None = None
    factors: list[tuple[int, int]] | None = None  # K-FAC's (n_a, n_g) of each layer

    def _seconds(self, flops: float) -> float:
        return self.device.matmul_s(flops, self.precision) + LAUNCH_S

    def blocks(self, rows: int, threads: int) -> BlockTimes:
        return BlockTimes(
            rows=rows,
            threads=threads,
            fwd_s=[self._seconds(rows * l.fwd_flops) for l in self.layers],
            bwd_s=[self._seconds(2 * rows * l.fwd_flops) for l in self.layers],
        )

    def step(self, rows: int, threads: int) -> float:
        return sum(self.blocks(rows, threads).costs()) + self.update(0, len(self.layers), threads)

    def update(self, first: int, count: int, threads: int) -> float:
        return LAUNCH_S * count

    def admm(self, rows: int, threads: int, pooled: bool = False) -> AdmmTimes:
        # pooled (--replicas): the same FLOPs on a block's part of the samples
        if self.admm_flops is None:
            raise ValueError("this profile has no pdADMM FLOP estimates")
        costs, refits, widths = self.admm_flops(rows)
        return AdmmTimes(
            rows=rows,
            threads=threads,
            layer_s=[self._seconds(c) for c in costs],
            readout_s=sum(self._seconds(c) for c in refits),
            start_s=sum(self._seconds(c) for c in costs),  # one sweep
            costs=costs,
            widths=widths,
        )

    def kfac(self, rows: int, threads: int) -> KfacTimes:
        """A step adds each layer's batch factors (2 rows n^2 FLOPs each) and its
        preconditioning (2 n_g n_a (n_a + n_g)); a decomposition is two symmetric
        eigendecompositions (about 9 n^3 FLOPs each, an estimate for LAPACK's syevd)."""
        if self.factors is None:
            raise ValueError("this profile has no K-FAC factor sizes")
        extra = sum(
            self._seconds(2 * rows * (a * a + g * g) + 2 * g * a * (a + g)) for a, g in self.factors
        )
        return KfacTimes(
            rows=rows,
            threads=threads,
            step_s=self.step(rows, threads) + extra,
            decompose_s=[self._seconds(9 * (a**3 + g**3)) for a, g in self.factors],
            n_a=[a for a, _ in self.factors],
            n_g=[g for _, g in self.factors],
        )

    def ddp_step(self, rows: int, threads: int) -> float:
        return self.step(rows, threads) + RUNTIME_S

    def pipeline_action(self, rows: int, m: int, threads: int) -> float:
        return RUNTIME_S
