"""ddp's ``--sync-plan``, applied: each tensor's method run every step by gradient hooks.

The planner is pure (:mod:`deepjimu.cost.sync`) and what it needs is measured by
:mod:`deepjimu.measure.sync` (the ddp strategy asks its run's measurer); here is the executor:

- :class:`SyncExecutor` replaces DDP for a plan other than all-reduce everywhere: a hook
  on every parameter starts its method's first collective as soon as autograd has
  accumulated its gradient (so the messages overlap the rest of the backward pass), and
  :meth:`SyncExecutor.finish` completes them in the order they started (every rank starts
  the same collectives in the same order, as gloo needs) and writes the averaged gradient.
  Small dense tensors to all-reduce (:func:`~deepjimu.compress.payload.fuses`) wait for the end of the backward
  pass and go in one all-reduce, as torch's DDP buckets them.
  Each payload is counted where it is handed to its collective, by the rules of
  :mod:`deepjimu.compress.base`: all-reduce sent = received = its bytes; all-gather sent
  its payload, received ``world`` payloads; reduce-scatter sent its input, received its
  shard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.comm import Comm, nbytes
from deepjimu.compress.payload import COUNT_BYTES, fuses

__all__ = ["SyncExecutor", "linear_weights", "sparse_all_reduce", "sparse_embeddings"]

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


def linear_weights(model: nn.Module) -> dict[str, nn.Linear]:
    """Parameter name -> module of every Linear weight (whose gradient sufficient factors can rebuild)."""
    return {
        f"{name}.weight" if name else "weight": m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
    }


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

    Use: ``loss.backward()``, then :meth:`finish` before the optimizer step. While
    :attr:`enabled` is False its hooks do nothing (another synchronisation steps the same
    model: ``--sync-plan auto``'s trial against DDP); :meth:`close` removes them.
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
        self.enabled = True
        self._handles: list[Any] = []
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, 0, group=group)
        linears = linear_weights(model)
        embeddings = sparse_embeddings(model)
        for name, p in model.named_parameters():
            method = methods.get(name, "allreduce")
            if method == "sfb":
                m = linears[name]
                self._handles.append(m.register_forward_hook(self._capture(name, m)))
            fused = method == "allreduce" and fuses(name in embeddings, p.numel())
            ready = self._fuse if fused else self._ready(name, method)
            self._handles.append(p.register_post_accumulate_grad_hook(ready))  # type: ignore[arg-type]

    def close(self) -> None:
        """Remove every hook: the model is synchronised another way from now on."""
        for h in self._handles:
            h.remove()
        self._handles = []

    @property
    def compressing(self) -> bool:
        """True once a step has been synchronised (the ddp strategy times steps from then)."""
        return self.iter > 0

    def _capture(self, name: str, m: nn.Linear) -> Callable[..., None]:
        def hook(_m: nn.Module, inputs: tuple[Tensor, ...], out: Tensor) -> None:
            if not (self.enabled and torch.is_grad_enabled() and m.training):
                return
            a = inputs[0].detach().reshape(-1, m.in_features)
            self._factors[name] = [a]
            out.register_hook(
                lambda g: self._factors[name].append(g.detach().reshape(-1, m.out_features))
            )

        return hook

    def _ready(self, name: str, method: str) -> Callable[[Tensor], None]:
        def hook(p: Tensor) -> None:
            if not self.enabled:
                return
            self.last_call = time.perf_counter()
            assert isinstance(p, nn.Parameter) and p.grad is not None
            start = getattr(self, f"_start_{method}")
            work, state = start(name, p.grad)
            self._pending.append((method, p, work, state))

        return hook

    def _fuse(self, p: nn.Parameter) -> None:
        """A small gradient to all-reduce: it waits for the end of the backward pass."""
        if self.enabled:
            self._fused.append(p)

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
        self._fused.clear()
        if not params:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        self.comm.count(sent=nbytes(flat), recv=nbytes(flat))
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world)
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad = g.view(p.shape)
