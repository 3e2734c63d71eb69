"""What ddp's ``--sync-plan`` needs measured: every parameter tensor as the planner sees it, the link at the plan's sizes; then the plan.

Collective: every rank calls :func:`make_plan` at the same point (the ddp strategy does, at
its set-up, through its run's measurer) and returns the same plan: every figure is the
slowest rank's. A Linear weight's rows come from a forward hook on this rank's first
batches, a sparse embedding's from the rows its gradient touched; the rebuild of a
Linear's sufficient factors is timed; the link is the probe's own timing
(:mod:`deepjimu.measure.links`) at the sizes the plan's messages take. The planner is pure
(:func:`deepjimu.cost.sync.plan_sync`); the executor that applies the plan is
:class:`deepjimu.compress.sync.SyncExecutor`.
"""

from __future__ import annotations

import functools
import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.compress.sync import (
    SyncExecutor,
    linear_weights,
    sparse_all_reduce,
    sparse_embeddings,
)
from deepjimu.cost.cluster import probed_cluster
from deepjimu.cost.probe import fit_alpha_beta
from deepjimu.cost.sync import (
    SyncPlan,
    SyncTrial,
    TensorInfo,
    applicable,
    method_messages,
    plan_sync,
)
from deepjimu.measure.links import measure_links, time_messages
from deepjimu.measure.timing import median_s, slowest, timed_s

__all__ = ["make_plan", "tensor_infos", "trial_steps"]

_LINKS = ["all_reduce", "reduce_scatter", "all_gather"]


def tensor_infos(
    model: nn.Module, batches: Sequence[tuple[Tensor, Tensor]], rows: int, device: torch.device
) -> list[TensorInfo]:
    """Collective: every parameter as the planner sees it, the same on every rank.

    A Linear weight's ``rows`` is ``rows`` (the most batch rows a rank takes in a step)
    times the input rows per sample it saw on ``batches[0]`` (1 for flat inputs); a sparse
    embedding's, the rows the gradient touched, the busiest rank's per batch, averaged over
    ``batches`` (this rank's first ones; the gradients are dropped). The rebuild of a
    Linear's sufficient factors is timed here (the slowest rank's median of 5).
    """
    linears, embeddings = linear_weights(model), sparse_embeddings(model)
    per_sample: dict[str, float] = {}

    def seen(name: str, m: nn.Linear) -> Callable[..., None]:
        def hook(_m: nn.Module, inputs: tuple[Tensor, ...], _out: Tensor) -> None:
            per_sample.setdefault(name, inputs[0].numel() / m.in_features / len(batches[0][1]))

        return hook

    handles = [m.register_forward_hook(seen(n, m)) for n, m in linears.items()]
    touched: dict[str, list[float]] = {n: [] for n in embeddings}
    named = dict(model.named_parameters())
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
        for n in embeddings:
            g = named[n].grad
            touched[n].append(float(g.coalesce()._nnz()) if g is not None and g.is_sparse else 0.0)
    model.zero_grad(set_to_none=True)
    for h in handles:
        h.remove()
    world = dist.get_world_size()
    native = sparse_all_reduce()
    names = sorted(touched)
    maxima = slowest([v for n in names for v in touched[n]], device)
    k = len(batches)
    sparse_rows = {n: statistics.mean(maxima[i * k : (i + 1) * k]) for i, n in enumerate(names)}
    infos = []
    for name, p in model.named_parameters():
        if name in embeddings:
            touched_rows = sparse_rows[name]
            infos.append(
                TensorInfo(name, tuple(p.shape), "embedding", rows=touched_rows, native=native)
            )
        elif name in linears and name in per_sample:
            k_rows = rows * per_sample[name]
            infos.append(TensorInfo(name, tuple(p.shape), "linear", rows=k_rows))
        else:
            infos.append(TensorInfo(name, tuple(p.shape)))
    rebuild = [_time_rebuild(t, world, device) if t.kind == "linear" else 0.0 for t in infos]
    rebuild = slowest(rebuild, device)
    return [
        replace(t, rebuild_s=s) if t.kind == "linear" else t
        for t, s in zip(infos, rebuild, strict=True)
    ]


def _time_rebuild(t: TensorInfo, world: int, device: torch.device, reps: int = 5) -> float:
    """Median seconds of adding the other ranks' factors to a gradient of ``t``'s shape."""
    out_dim, in_dim = t.shape
    k = max(1, round(t.rows)) * (world - 1)
    grad = torch.zeros(out_dim, in_dim, device=device)
    g, a = torch.randn(k, out_dim, device=device), torch.randn(k, in_dim, device=device)
    return median_s(lambda: torch.addmm(grad, g.T, a), reps, device)


def make_plan(
    model: nn.Module,
    batches: Sequence[tuple[Tensor, Tensor]],
    rows: int,
    plan: str,
    device: torch.device,
    max_op_s: float = 0.25,
) -> SyncPlan:
    """Collective: describe the tensors (:func:`tensor_infos`), probe the link at the sizes
    the plan's messages take, and plan (:func:`deepjimu.cost.sync.plan_sync`).

    Every rank returns the same plan: every figure is the slowest rank's.
    """
    infos = tensor_infos(model, batches, rows, device)
    world = dist.get_world_size()
    msgs = [m for t in infos for method in applicable(t) for m in method_messages(t, method, world)]
    largest = max(b for _, b in msgs)
    points = measure_links(device, max_op_s, _LINKS, largest)
    links = {k: fit_alpha_beta([n for n, _ in v], [s for _, s in v]) for k, v in points.items()}
    cluster = probed_cluster(links, world, str(device))
    measured = time_messages(msgs, device)
    entries = plan_sync(infos, plan, cluster, world, measured)
    fits = {
        k: {"alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte} for k, f in links.items()
    }
    return SyncPlan(entries, fits, measured)


def trial_steps(
    model: nn.Module,
    ddp: nn.Module,
    executor: SyncExecutor,
    batches: Sequence[tuple[Tensor, Tensor]],
    device: torch.device,
    rounds: tuple[int, int] = (7, 60),
    budget_s: float = 10.0,
) -> SyncTrial:
    """Collective: ``executor``'s plan and ``ddp`` (torch's DDP wrapping ``model``, the
    executor's hooks on the same parameters) stepped alternately on ``batches``: a forward,
    a backward and the gradients' synchronisation, no optimizer step (the weights stay as
    they are). Each plays first in every other round; after a warm-up step of each (DDP
    builds its buckets), as many rounds as fit in ``budget_s``, within ``rounds`` (the
    fewest and the most: quick steps get many rounds, so that their verdict is past the
    noise, and slow ones at least the fewest). Every figure is the slowest rank's.

    A forward through ``model`` itself leaves DDP's hooks idle (torch's DDP synchronises
    only a backward whose forward went through it); the executor's are switched off
    (:attr:`~deepjimu.compress.sync.SyncExecutor.enabled`) while DDP steps.
    """
    turns = itertools.cycle(batches)

    def step(plan: bool) -> None:
        x, y = next(turns)
        executor.enabled = plan
        model.zero_grad(set_to_none=True)
        F.cross_entropy((model if plan else ddp)(x.to(device)), y.to(device)).backward()
        if plan:
            executor.finish()

    plan_s: list[float] = []
    ddp_s: list[float] = []
    try:
        step(False)  # warm-up
        step(True)
        spent = 0.0
        least, most = rounds
        for r in range(most):
            order = (False, True) if r % 2 == 0 else (True, False)
            times = {plan: timed_s(functools.partial(step, plan), device) for plan in order}
            t_plan, t_ddp = slowest([times[True], times[False]], device)
            plan_s.append(t_plan)
            ddp_s.append(t_ddp)
            spent += t_plan + t_ddp
            # every rank stops at the same round: the times are every rank's slowest
            if r + 1 >= least and spent * (r + 2) / (r + 1) > budget_s:
                break
    finally:
        executor.enabled = True
        model.zero_grad(set_to_none=True)
    return SyncTrial(tuple(plan_s), tuple(ddp_s))
