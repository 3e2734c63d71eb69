"""A model's work on this device for the planner: its blocks, a step, K-FAC's, pdADMM's phases, DDP's and the pipelining runtime's own work.

The planning layer's predictors are pure; this module is where their compute figures
come from when the cluster is the machine we run on (``jimu plan --cluster probe``).
Every figure is the median of a few repeats after a warm-up, measured in this process
with a given number of threads (a worker of ``P`` on ``C`` cores runs with ``C // P``,
:func:`deepjimu.threads.plan_threads`), so a prediction for ``P`` workers uses what one
of them really gets (the blocks and the step: :mod:`deepjimu.measure.blocks`); ``jimu
plan`` sets this process's OpenMP wait policy to a one-worker run's before torch loads
(:mod:`deepjimu.plan.measuring`).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel

from deepjimu.choices import Optimizer
from deepjimu.comm import Comm, CommStats
from deepjimu.compress.hooks import comm_hook
from deepjimu.config import RunConfig
from deepjimu.cost.probe import noisy_repeats, relative_spread
from deepjimu.cost.profile import AdmmTimes, BlockTimes, KfacTimes
from deepjimu.kfac.precondition import decompose
from deepjimu.measure.blocks import block_times, plain_step, step_times, update_time, use_threads
from deepjimu.measure.timing import median_s, timed_runs, timed_s
from deepjimu.options.compress import parse_compress
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import Exchange, choose_readout, init_blocks_forward
from deepjimu.strategies.admm.layers import ConvOp
from deepjimu.strategies.admm.model import admm_layers, new_block
from deepjimu.strategies.admm.pooled import SelfPool
from deepjimu.strategies.admm.settings import admm_settings
from deepjimu.strategies.base import make_optimizer

__all__ = [
    "ROUNDS",
    "MeasuredCompute",
    "admm_times",
    "ddp_step_times",
    "kfac_times",
    "median_figure",
    "pipeline_action_time",
]


def kfac_times(
    model: nn.Sequential, x: Tensor, y: Tensor, cfg: RunConfig, cycles: int = 2
) -> KfacTimes:
    """K-FAC (``--optimizer kfac``) in one process on the rows of ``x``: the mean step that
    decomposes nothing, over ``cycles`` rounds of ``--kfac-inv-every`` steps after one
    (factor updates every ``--kfac-factor-every`` steps are in that mean), and each
    layer's decomposition of its running factors, timed apart."""
    cfg = dataclasses.replace(cfg, optimizer=Optimizer.KFAC)
    probe = copy.deepcopy(model).to(x.device)
    optimizer = make_optimizer(probe.parameters(), cfg, probe)
    step = plain_step(probe, optimizer, x, y)
    every = cfg.kfac_inv_every
    plain: list[float] = []
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for i in range((cycles + 1) * every):
            seconds = timed_s(step, x.device)
            if i >= every and i % every:
                plain.append(seconds)
        layers = optimizer.preconditioner.layers or []  # type: ignore[attr-defined]
        decompose_s = []
        for layer in layers:

            def once(a: Tensor = layer.A, g: Tensor = layer.G) -> None:
                decompose(cfg.kfac_method, a, g, cfg.kfac_damping)

            decompose_s.append(median_s(once, 3, x.device))
    return KfacTimes(
        rows=len(x),
        threads=torch.get_num_threads(),
        step_s=statistics.fmean(plain),
        decompose_s=decompose_s,
        n_a=[layer.n_a for layer in layers],
        n_g=[layer.n_g for layer in layers],
    )


def admm_times(
    model: nn.Sequential, x: Tensor, y: Tensor, cfg: RunConfig, iterations: int = 6,
    pooled: bool = False,
) -> AdmmTimes:  # fmt: skip
    """pdADMM on one worker over the rows of ``x`` (full batch): each phase's seconds per iteration.
    With ``pooled``, of a block whose sums over samples are pooled with its replicas'
    (``--replicas``): their code path (the (W, b) step from statistics, on the inputs'
    side), timed without the messages (:class:`~deepjimu.strategies.admm.pooled.SelfPool`),
    which the predictor prices over the cluster's links.

    Runs the strategy's own serial iteration after its forward start, each layer's updates
    timed apart (:meth:`~deepjimu.strategies.admm.blocks.LayerBlock.layer_updates`), and
    the readout that each log runs (``--admm-readout``); the extrapolation (``momentum``),
    one pass over the block, is shared over the layers by their (W, b) FLOP estimates.
    """
    model = copy.deepcopy(model).to(x.device)
    _, maps, ops = admm_layers(model, tuple(x.shape[1:]), cg_max_iter=cfg.admm_cg_iters)
    L, n = len(maps), len(x)
    settings = admm_settings(cfg, ops, keep=False)
    params = AdmmParams.of(cfg.rho, cfg.nu, cfg.quantize, cfg.admm_tau, settings)
    block = new_block(maps, ops, 0, L, params)
    block.pooled = SelfPool() if pooled else None
    inputs = x if isinstance(ops[0], ConvOp) else x.flatten(1)
    ex = Exchange(Comm(CommStats()), cfg.quantize, x.device)
    start_s = _admm_start_s(block, inputs, y, n, ex, int(settings["sweeps"]))
    layers, momentum, readout = _admm_phase_s(
        block, inputs, y, n, ex, cfg.admm_readout, params.momentum, iterations
    )
    # the first iterations still allocate and warm the solvers: a run's steady state is later
    warm = 2 if iterations > 2 else 0
    wb_flops = [op.flops(n, with_p=False) for op in ops]
    extra = statistics.median(momentum[warm:])
    per_layer = [
        statistics.median(s[l] for s in layers[warm:]) + _share(extra, wb_flops, l)
        for l in range(L)
    ]
    return AdmmTimes(
        rows=n,
        threads=torch.get_num_threads(),
        layer_s=per_layer,
        readout_s=statistics.median(readout[warm:]),
        start_s=start_s,
        costs=[op.flops(n, with_p=l > 0) for l, op in enumerate(ops)],
        widths=[math.prod(op.out_shape) for op in ops],
    )


def _admm_start_s(
    block: LayerBlock, inputs: Tensor, y: Tensor, n: int, ex: Exchange, sweeps: int
) -> float:
    """Seconds of pdADMM's start on one worker: the forward chain, then ``sweeps`` backward sweeps."""

    def start() -> None:
        init_blocks_forward(block, inputs, n, ex, 0, 1)
        with torch.no_grad():
            for _ in range(sweeps):
                block.sweep_backward(y)

    return timed_s(start, inputs.device)


def _admm_phase_s(
    block: LayerBlock,
    inputs: Tensor,
    y: Tensor,
    n: int,
    ex: Exchange,
    readout_mode: str,
    momentum_factor: float,
    iterations: int,
) -> tuple[list[list[float]], list[float], list[float]]:
    """Per iteration, the seconds of each layer's updates, of the extrapolation (0 without
    momentum) and of the readout (``--admm-readout``)."""
    layers: list[list[float]] = []  # per iteration, each layer's seconds
    momentum: list[float] = []
    readout: list[float] = []
    with torch.no_grad():
        for _ in range(iterations):
            seconds = [0.0] * block.L
            for l, update in block.layer_updates(y):
                seconds[l] += timed_s(update, inputs.device)
            layers.append(seconds)
            momentum.append(timed_s(block.extrapolate, inputs.device) if momentum_factor else 0.0)
            readout.append(
                timed_s(
                    lambda: choose_readout(block, inputs, y, n, ex, 0, 1, readout_mode),
                    inputs.device,
                )
            )
    return layers, momentum, readout


def _share(total: float, weights: list[float], i: int) -> float:
    """Layer ``i``'s part of ``total``, in proportion to ``weights``."""
    s = sum(weights)
    return total * weights[i] / s if s > 0 else total / len(weights)


@contextmanager
def solo_group() -> Iterator[None]:
    """A process group of this process alone (gloo), for timing DDP and the pipelining
    runtime without other ranks; one that exists already is used as it is."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def ddp_step_times(
    model: nn.Sequential, x: Tensor, y: Tensor, cfg: RunConfig, repeats: int = 15
) -> list[float]:
    """Seconds of each of ``repeats`` ``ddp`` steps on ``x`` under torch's DDP over this
    process alone: the plain step plus DDP's own work (its buckets, the strategy's comm hook
    and the all-reduce call)."""
    devices = [x.device] if x.device.type == "cuda" else []
    with solo_group(), torch.random.fork_rng(devices=devices):
        seconds = _ddp_steps(model, x, y, cfg, repeats)
        # DDP is gone (with _ddp_steps' frame) while the group lives, and the barrier queues
        # behind every callback of the hook: else the group, freed with DDP's reducer under
        # the GIL, joins its thread while that thread waits for the GIL to free a callback
        dist.barrier()
        return seconds


def _ddp_steps(
    model: nn.Sequential, x: Tensor, y: Tensor, cfg: RunConfig, repeats: int
) -> list[float]:

    ids = [x.device.index] if x.device.type == "cuda" else None
    ddp = DistributedDataParallel(copy.deepcopy(model).to(x.device), device_ids=ids)
    # the strategy's own comm hook (it counts the bytes of every bucket it all-reduces)
    state, hook = comm_hook(parse_compress("none"), Comm(CommStats()), 2, x.device, seed=cfg.seed)
    ddp.register_comm_hook(state, hook)
    optimizer = make_optimizer(ddp.parameters(), cfg)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()

    for _ in range(3):  # DDP rebuilds its buckets after the first step
        step()
    return timed_runs(step, repeats, x.device)


def pipeline_action_time(
    model: nn.Sequential, x: Tensor, y: Tensor, m: int, repeats: int = 5
) -> float:
    """Seconds the pipelining runtime adds to each forward or backward action: a GPipe
    schedule of the whole model as one stage over this process alone, with ``m``
    micro-batches of ``x``'s rows each, less the blocks' own forward and backward."""
    probe = copy.deepcopy(model).to(x.device)
    devices = [x.device] if x.device.type == "cuda" else []
    with solo_group(), torch.random.fork_rng(devices=devices):
        with torch.no_grad():
            out = probe(x)
        stage = PipelineStage(
            probe, 0, 1, x.device, input_args=x, output_args=out.detach().requires_grad_(True)
        )
        schedule = ScheduleGPipe(
            stage, m, loss_fn=lambda o, t: F.cross_entropy(o, t), scale_grads=False
        )
        xs, ys = x.repeat(m, *[1] * (x.dim() - 1)), y.repeat(m)
        step = median_s(lambda: schedule.step(xs, target=ys, losses=[]), repeats, x.device)
    compute = sum(block_times(model, x).costs())
    return max(0.0, (step - m * compute) / (2 * m))


def median_figure(rounds: list[Any]) -> Any:
    """The median over rounds of one measured figure: of numbers, element by element of
    lists, field by field of a dataclass (what every round has alike, a count, as it is).

    Example:
        >>> median_figure([[1.0, 5.0], [2.0, 4.0], [9.0, 3.0]])
        [2.0, 4.0]
    """
    first = rounds[0]
    if all(r == first for r in rounds):
        return first
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        fields = {f.name: median_figure([getattr(r, f.name) for r in rounds])
                  for f in dataclasses.fields(first)}  # fmt: skip
        return dataclasses.replace(first, **fields)
    if isinstance(first, list | tuple):
        return type(first)(median_figure(list(c)) for c in zip(*rounds, strict=True))
    return statistics.median(rounds)


ROUNDS = 3
"""Rounds of every figure ``jimu plan`` measures in its process, each round of all of them in
turn (:meth:`MeasuredCompute.again`): the VM's noise comes in modes of seconds, and 15
repeats one after the other once caught one, so that a one-process row was predicted 13-27%
too slow (issue 47); a figure is the median over its rounds."""


class MeasuredCompute:
    """:class:`~deepjimu.cost.profile.Compute` of this device, measured on first use and kept.

    Args:
        model: the model to time (copied; never changed).
        x, y: training rows and labels (on the device): a figure for ``rows`` times their
            first ``rows`` (repeated when there are fewer).
        cfg: the run's config (optimizer, admm options).

    Every figure is kept per round: :meth:`again` measures each once more, all of them in
    turn, and a figure is then the median over its rounds (a step's: over all its
    repeats). ``notes`` holds a line for each step measured so far whose repeats disagreed
    past the tolerance (:func:`~deepjimu.cost.probe.noisy_repeats`), ``spreads`` each
    step's spread (:func:`~deepjimu.cost.probe.relative_spread`): of its rounds' medians
    once it has several (how far the same step measured at other moments differs), else
    of its repeats.
    """

    def __init__(self, model: nn.Sequential, x: Tensor, y: Tensor, cfg: RunConfig) -> None:
        self.model, self.x, self.y, self.cfg = model, x, y, cfg
        self._rounds: dict[tuple[object, ...], list[Any]] = {}
        self._measures: dict[tuple[object, ...], tuple[int, Callable[[], Any]]] = {}
        self._steps: list[tuple[object, ...]] = []  # the figures that are lists of repeats
        self.notes: list[str] = []

    def _once(self, key: tuple[object, ...], threads: int, measure: Callable[[], Any]) -> Any:
        """``measure()`` with ``threads`` threads the first time ``key`` (with ``threads``) is
        asked for, kept as its first round; the median over its rounds
        (:func:`median_figure`)."""
        return median_figure(self._kept(key, threads, measure))

    def _kept(self, key: tuple[object, ...], threads: int, measure: Callable[[], Any]) -> list[Any]:
        full = (*key, threads)
        if full not in self._rounds:
            self._measures[full] = (threads, measure)
            with use_threads(threads):
                self._rounds[full] = [measure()]
        return self._rounds[full]

    def again(self) -> None:
        """One more round of every figure measured so far, each in turn at its threads."""
        for full, (threads, measure) in self._measures.items():
            with use_threads(threads):
                self._rounds[full].append(measure())

    @property
    def spreads(self) -> list[float]:
        """Each step's spread: of its rounds' medians where it has several, else of its
        repeats."""
        out = []
        for full in self._steps:
            rounds = self._rounds[full]
            medians = [statistics.median(r) for r in rounds]
            out.append(relative_spread(medians if len(rounds) > 1 else rounds[0]))
        return out

    def _median(
        self, what: str, key: tuple[Any, int], threads: int, measure: Callable[[], list[float]]
    ) -> float:
        """The median of every repeat that ``measure()`` timed on ``key``'s rows, over all its
        rounds; the first time, a line in :attr:`notes` where its repeats spread past the
        tolerance."""
        new = (*key, threads) not in self._rounds
        rounds = self._kept(key, threads, measure)
        if new:
            self._steps.append((*key, threads))
            where = f"{self.cfg.model}, {key[1]} rows, {threads} thread(s)"
            if noisy := noisy_repeats(f"{what} measured in this process ({where})", rounds[0]):
                self.notes.append(noisy)
        return statistics.median(itertools.chain.from_iterable(rounds))

    def _rows(self, rows: int) -> tuple[Tensor, Tensor]:
        index = torch.arange(rows, device=self.x.device) % len(self.x)
        return self.x[index], self.y[index]

    def blocks(self, rows: int, threads: int) -> BlockTimes:
        run = lambda: block_times(self.model, self._rows(rows)[0])  # noqa: E731
        return self._once((block_times, rows), threads, run)  # type: ignore[no-any-return]

    def step(self, rows: int, threads: int) -> float:
        run = lambda: step_times(self.model, *self._rows(rows), self.cfg)  # noqa: E731
        return self._median("the step", (step_times, rows), threads, run)

    def update(self, first: int, count: int, threads: int) -> float:
        run = lambda: update_time(self.model, self._rows(1)[0], self.cfg, first, count)  # noqa: E731
        return self._once((update_time, first, count), threads, run)  # type: ignore[no-any-return]

    def admm(self, rows: int, threads: int, pooled: bool = False) -> AdmmTimes:
        run = lambda: admm_times(self.model, *self._rows(rows), self.cfg, pooled=pooled)  # noqa: E731
        return self._once((admm_times, rows, pooled), threads, run)  # type: ignore[no-any-return]

    def kfac(self, rows: int, threads: int) -> KfacTimes:
        run = lambda: kfac_times(self.model, *self._rows(rows), self.cfg)  # noqa: E731
        return self._once((kfac_times, rows), threads, run)  # type: ignore[no-any-return]

    def ddp_step(self, rows: int, threads: int) -> float:
        run = lambda: ddp_step_times(self.model, *self._rows(rows), self.cfg)  # noqa: E731
        return self._median("the DDP step", (ddp_step_times, rows), threads, run)

    def pipeline_action(self, rows: int, m: int, threads: int) -> float:
        run = lambda: pipeline_action_time(self.model, *self._rows(rows), m)  # noqa: E731
        return self._once((pipeline_action_time, rows, m), threads, run)  # type: ignore[no-any-return]
