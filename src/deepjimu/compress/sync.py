"""ddp's ``--sync-plan``: measure what the planner needs, make the plan, and apply it each step with gradient hooks.

The planner is pure (:mod:`deepjimu.cost.sync`); here are the two collective parts:

- :func:`make_plan` describes every parameter tensor (Linear weights: input rows per rank;
  sparse embeddings: rows a step touches, measured on this rank's first batches), times
  the rebuild of sufficient factors, fits all-reduce, reduce-scatter and all-gather to
  latency + bytes / bandwidth over the run's group (the probe's own timing,
  :mod:`deepjimu.compress.probe`, at the sizes the plan needs) and times its all-gathers at
  their own sizes, then plans;
- :class:`SyncExecutor` replaces DDP for a plan other than all-reduce everywhere: a hook
  on every parameter starts its method's first collective as soon as autograd has
  accumulated its gradient (so the messages overlap the rest of the backward pass), and
  :meth:`SyncExecutor.finish` completes them in the order they started (every rank starts
  the same collectives in the same order, as gloo needs) and writes the averaged gradient.
  Small dense tensors to all-reduce (``plan.sync.fused``) wait for the end of the backward
  pass and go in one all-reduce, as torch's DDP buckets them.
  Each payload is counted where it is handed to its collective, by the rules of
  :mod:`deepjimu.compress.base`: all-reduce sent = received = its bytes; all-gather sent
  its payload, received ``world`` payloads; reduce-scatter sent its input, received its
  shard.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.comm import Comm, nbytes
from deepjimu.compress.probe import _measure_links, _time_messages, fit_alpha_beta
from deepjimu.cost.cluster import probed_cluster
from deepjimu.cost.sync import (
    COUNT_BYTES,
    SyncEntry,
    TensorInfo,
    applicable,
    fused,
    method_messages,
    plan_sync,
)

__all__ = [
    "SyncExecutor",
    "SyncPlan",
    "make_plan",
    "sparse_all_reduce",
    "sparse_embeddings",
    "tensor_infos",
]

_LINKS = ["all_reduce", "reduce_scatter", "all_gather"]
# torch 2.13 renamed these two (the old names deprecated there); older versions have only those
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


def sparse_all_reduce(group: dist.ProcessGroup | None = None) -> bool:
    """Whether the group's backend all-reduces sparse tensors itself (gloo all-gathers the
    counts, indices and values; NCCL has no sparse all-reduce)."""
    return dist.get_backend(group) == "gloo"


def sparse_embeddings(model: nn.Module) -> dict[str, nn.Module]:
    """Parameter name -> module of every embedding weight whose gradient is sparse."""
    return {
        f"{name}.weight" if name else "weight": m
        for name, m in model.named_modules()
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
    }


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {
        f"{name}.weight" if name else "weight": m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
    }


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # bookkeeping: not counted
    return [float(v) for v in t.tolist()]


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
    linears, embeddings = _linears(model), sparse_embeddings(model)
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
    maxima = _max_over_ranks([v for n in names for v in touched[n]], device)
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
    rebuild = _max_over_ranks(rebuild, device)
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
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        torch.addmm(grad, g.T, a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


@dataclass
class SyncPlan:
    """What :func:`make_plan` found: the plan's entries and the figures it came from."""

    entries: list[SyncEntry]
    links: dict[str, Any]
    measured: dict[str, float]


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
    points = _measure_links(device, max_op_s, _LINKS, largest)
    links = {k: fit_alpha_beta([n for n, _ in v], [s for _, s in v]) for k, v in points.items()}
    cluster = probed_cluster(links, world, str(device))
    measured = _time_messages(msgs, device)
    entries = plan_sync(infos, plan, cluster, world, measured)
    fits = {
        k: {"alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte} for k, f in links.items()
    }
    return SyncPlan(entries, fits, measured)


class SyncExecutor:
    """Applies a sync plan to ``model``'s gradients each step (see the module docstring).

    Args:
        model: the replica (its parameters and buffers are broadcast from rank 0 first,
            as DDP does).
        methods: parameter name -> method (``allreduce``, ``ps``, ``sfb``, ``sparse``).
        comm: the rank's byte counter.
        factor_rows: per SFB weight, the most input rows a rank gives it in a step (the
            plan's ``rows``): every rank pads its factors to that many rows, so that they
            can be all-gathered (zero rows add nothing).
        group: the process group (None: the default group).
        native: hand sparse rows to the backend's own sparse all-reduce (default: where the
            backend has one, gloo); else all-gather them by hand (NCCL has none).

    Use: ``loss.backward()``, then :meth:`finish` before the optimizer step.
    """

    def __init__(
        self,
        model: nn.Module,
        methods: dict[str, str],
        comm: Comm,
        factor_rows: dict[str, int] | None = None,
        group: dist.ProcessGroup | None = None,
        native: bool | None = None,
    ) -> None:
        self.comm, self.group = comm, group
        self.world = dist.get_world_size(group)
        self.native = sparse_all_reduce(group) if native is None else native
        self.factor_rows = factor_rows or {}
        self.iter = 0
        self.last_call = 0.0
        self._pending: list[tuple[str, nn.Parameter, Any, dict[str, Any]]] = []
        self._fused: list[nn.Parameter] = []  # small all-reduced gradients, in one message
        self._factors: dict[str, list[Tensor]] = {}
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, 0, group=group)
        linears = _linears(model)
        embeddings = sparse_embeddings(model)
        for name, p in model.named_parameters():
            method = methods.get(name, "allreduce")
            if method == "sfb":
                m = linears[name]
                m.register_forward_hook(self._capture(name, m))
            kind = "embedding" if name in embeddings else "dense"
            if method == "allreduce" and fused(TensorInfo(name, tuple(p.shape), kind)):
                p.register_post_accumulate_grad_hook(self._fused.append)  # type: ignore[arg-type]
            else:
                p.register_post_accumulate_grad_hook(self._ready(name, method))

    @property
    def compressing(self) -> bool:
        """True once a step has been synchronised (the ddp strategy times steps from then)."""
        return self.iter > 0

    def _capture(self, name: str, m: nn.Linear) -> Callable[..., None]:
        def hook(_m: nn.Module, inputs: tuple[Tensor, ...], out: Tensor) -> None:
            if not (torch.is_grad_enabled() and m.training):
                return
            a = inputs[0].detach().reshape(-1, m.in_features)
            self._factors[name] = [a]
            out.register_hook(
                lambda g: self._factors[name].append(g.detach().reshape(-1, m.out_features))
            )

        return hook

    def _ready(self, name: str, method: str) -> Callable[[Tensor], None]:
        def hook(p: Tensor) -> None:
            self.last_call = time.perf_counter()
            assert isinstance(p, nn.Parameter) and p.grad is not None
            start = getattr(self, f"_start_{method}")
            work, state = start(name, p.grad)
            self._pending.append((method, p, work, state))

        return hook

    # phase 1, in the backward pass: each method's first collective
    def _start_allreduce(self, name: str, g: Tensor) -> tuple[Any, dict[str, Any]]:
        buf = (g.to_dense() if g.is_sparse else g).contiguous()
        self.comm.count(sent=nbytes(buf), recv=nbytes(buf))
        return dist.all_reduce(buf, group=self.group, async_op=True), {"buf": buf}

    def _start_ps(self, name: str, g: Tensor) -> tuple[Any, dict[str, Any]]:
        flat = (g.to_dense() if g.is_sparse else g).reshape(-1)
        pad = -len(flat) % self.world
        flat = F.pad(flat, (0, pad)) if pad else flat.contiguous()
        shard = torch.empty(len(flat) // self.world, dtype=flat.dtype, device=flat.device)
        self.comm.count(sent=nbytes(flat), recv=nbytes(shard))
        work = _reduce_scatter(shard, flat, group=self.group, async_op=True)
        return work, {"shard": shard, "n": g.numel()}

    def _start_sfb(self, name: str, g: Tensor) -> tuple[Any, dict[str, Any]]:
        a, out_grad = self._factors.pop(name)
        k = self.factor_rows[name]
        if len(a) > k:
            raise RuntimeError(f"sfb: {name} got {len(a)} input rows, more than the {k} planned")
        payload = torch.zeros(k, a.shape[1] + out_grad.shape[1], device=a.device)
        payload[: len(a), : a.shape[1]] = a
        payload[: len(a), a.shape[1] :] = out_grad
        gathered = torch.empty(self.world * k, payload.shape[1], device=a.device)
        self.comm.count(sent=nbytes(payload), recv=self.world * nbytes(payload))
        work = _all_gather(gathered, payload, group=self.group, async_op=True)
        return work, {"gathered": gathered, "k": k, "in": a.shape[1]}

    def _start_sparse(self, name: str, g: Tensor) -> tuple[Any, dict[str, Any]]:
        g = g.coalesce()
        if self.native:  # gloo's own sparse all-reduce, as DDP's: one call, no Python rows
            self.comm.count(
                sent=COUNT_BYTES + nbytes(g), recv=self.world * (COUNT_BYTES + nbytes(g))
            )
            return dist.all_reduce(g, group=self.group, async_op=True), {"native": True}
        count = torch.tensor([g._nnz()], dtype=torch.int64, device=g.device)
        counts = torch.empty(self.world, dtype=torch.int64, device=g.device)
        self.comm.count(sent=nbytes(count), recv=self.world * nbytes(count))
        work = _all_gather(counts, count, group=self.group, async_op=True)
        return work, {"grad": g, "counts": counts}

    def finish(self) -> None:
        """Complete every collective the backward pass started and write the averaged gradients.

        Collective: call on every rank after ``loss.backward()``.
        """
        rank = dist.get_rank(self.group)
        self._all_reduce_fused()  # after every hook's collective: the same order on every rank
        second: list[tuple[str, nn.Parameter, Any, dict[str, Any]]] = []
        for (
            method,
            p,
            work,
            state,
        ) in self._pending:  # the order they started: the same on every rank
            work.wait()
            if method == "allreduce":
                p.grad = state["buf"].div_(self.world).view(p.shape)
            elif method == "ps":  # the owner averages its shard; everyone gathers the shards
                shard = state["shard"].div_(self.world)
                full = torch.empty(self.world * len(shard), dtype=shard.dtype, device=shard.device)
                self.comm.count(sent=nbytes(shard), recv=nbytes(full))
                w = _all_gather(full, shard, group=self.group, async_op=True)
                second.append((method, p, w, {"full": full, "n": state["n"]}))
            elif method == "sfb":
                k, n_in, gathered = state["k"], state["in"], state["gathered"]
                others = torch.cat([gathered[: rank * k], gathered[(rank + 1) * k :]])
                assert p.grad is not None
                # the own factors' product is the gradient autograd already made
                grad = torch.addmm(p.grad, others[:, n_in:].T, others[:, :n_in])
                p.grad = grad.div_(self.world)
            elif state.get("native"):
                # a new tensor, in the future's value (Work.result() is deprecated, and warns)
                p.grad = work.get_future().value()[0].div_(self.world)
            else:
                g, counts = state["grad"], state["counts"]
                k = int(counts.max())
                payload = torch.zeros(k, 1 + g.shape[1], dtype=torch.float32, device=g.device)
                n = g._nnz()
                # one message: each row's int32 index, its bits carried as a float32 column
                payload[:n, 0] = g.indices()[0].to(torch.int32).view(torch.float32)
                payload[:n, 1:] = g.values()
                gathered = torch.empty(self.world * k, payload.shape[1], device=g.device)
                self.comm.count(sent=nbytes(payload), recv=self.world * nbytes(payload))
                w = _all_gather(gathered, payload, group=self.group, async_op=True)
                second.append((method, p, w, {"gathered": gathered, "counts": counts, "k": k}))
        for method, p, work, state in second:
            work.wait()
            if method == "ps":
                p.grad = state["full"][: state["n"]].view(p.shape)
            else:
                k, gathered = state["k"], state["gathered"]
                rows = torch.cat(
                    [
                        gathered[r * k : r * k + int(c)]
                        for r, c in enumerate(state["counts"].tolist())
                    ]
                )
                index = rows[:, 0].contiguous().view(torch.int32).to(torch.int64)
                # the rows are the ranks' own coalesced gradients': valid by construction
                p.grad = torch.sparse_coo_tensor(
                    index[None], rows[:, 1:] / self.world, p.shape, check_invariants=False
                ).coalesce()
        self._pending = []
        self._factors = {}
        self.iter += 1

    def _all_reduce_fused(self) -> None:
        """The small gradients that waited for the end of the backward pass, all-reduced as
        one flat message and averaged (the order autograd readied them: every rank's)."""
        params = list(self._fused)
        self._fused.clear()  # in place: the hooks hold this list's append
        if not params:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        self.comm.count(sent=nbytes(flat), recv=nbytes(flat))
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world)
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad = g.view(p.shape)
