"""Distributed K-FAC preconditioning (KAISA): factors all-reduced, decompositions and gradients broadcast.

The math is in :mod:`~deepjimu.kfac.factors` and :mod:`~deepjimu.kfac.precondition`, who
does what in :class:`~deepjimu.kfac.assignment.WorkAssignment`; this module only calls
them and moves tensors through :class:`~deepjimu.comm.Comm`, which counts every payload
where it is sent, by kind: ``kfac_factors`` (the all-reduced upper triangles of the batch
factors), ``kfac_decompositions`` (broadcast from a layer's inverse worker to its other
gradient workers) and ``kfac_gradients`` (preconditioned gradients broadcast to the ranks
that do not precondition that layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from deepjimu.choices import KfacMethod
from deepjimu.comm import Comm
from deepjimu.kfac.assignment import WorkAssignment, decomposition_cost
from deepjimu.kfac.factors import running_average, triu_pack, triu_unpack
from deepjimu.kfac.layers import KFACLayer, kfac_candidates
from deepjimu.kfac.precondition import METHODS, decompose, kl_clip_scale
from deepjimu.options import KfacGroup

__all__ = ["KFACPreconditioner", "KFACSettings"]


@dataclass(frozen=True)
class KFACSettings:
    """K-FAC's options (the ``--kfac-*`` flags).

    Args:
        damping: gamma added to each factor (see :mod:`~deepjimu.kfac.precondition`).
        kl_clip: bound on the step's quadratic KL estimate (0: no clipping).
        factor_decay: weight of the old running factors at each factor update.
        factor_every: steps between factor updates (their all-reduce).
        inv_every: steps between decompositions (and their broadcast).
        grad_workers: the fraction F of ranks that precondition each layer, 1/world..1.
        method: ``eigen`` or ``inverse``.
        speeds: each rank's measured speed (``--balance speed``): the decompositions are
            assigned by time (cost over speed), not cost; None: equal ranks.
    """

    damping: float = 0.1
    kl_clip: float = 0.001
    factor_decay: float = 0.95
    factor_every: int = 1
    inv_every: int = 10
    grad_workers: float = 1.0
    method: KfacMethod = KfacMethod.EIGEN
    speeds: tuple[float, ...] | None = None

    @classmethod
    def from_config(cls, cfg: KfacGroup) -> KFACSettings:
        """The settings of a run's ``kfac_*`` options."""
        return cls(
            damping=cfg.kfac_damping,
            kl_clip=cfg.kfac_kl_clip,
            factor_decay=cfg.kfac_factor_decay,
            factor_every=cfg.kfac_factor_every,
            inv_every=cfg.kfac_inv_every,
            grad_workers=cfg.kfac_grad_workers,
            method=cfg.kfac_method,
        )


class KFACPreconditioner:
    """Replaces the gradients of a model's Linear and Conv2d layers by K-FAC-preconditioned ones.

    Call :meth:`step` after ``backward()`` (and after DDP averaged the gradients), before
    the optimizer's step. Hooks are put on every candidate layer; at the first step only
    the layers whose hooks fired are kept (observed activity), the others keep their plain
    gradients. Every rank must call :meth:`step` at the same points (it is collective).

    Args:
        model: the model (the module DDP wraps, not the wrapper: names must match on all ranks).
        settings: the K-FAC options.
        comm: the counted messages of this rank. With torch.distributed initialised, K-FAC
            spans its default group (the ranks that hold replicas of ``model``: ddp);
            without a comm or a process group it runs alone.
    """

    def __init__(self, model: nn.Module, settings: KFACSettings, comm: Comm | None = None) -> None:
        self.settings = settings
        self.comm = comm
        on = comm is not None and dist.is_initialized()
        self.rank = dist.get_rank() if on else 0
        self.world = dist.get_world_size() if on else 1
        self.grad_workers = max(1, round(settings.grad_workers * self.world))
        self.candidates = [KFACLayer(name, m) for name, m in kfac_candidates(model)]
        self.layers: list[KFACLayer] | None = None
        self.assignment: WorkAssignment | None = None
        self.steps = 0
        self._groups = self._make_groups()

    def _make_groups(self) -> dict[tuple[int, ...], Any]:
        """Process groups of the gradient-worker and receiver groups that have 2 or more ranks.

        ``dist.new_group`` is collective over the world: every rank makes every group, in
        the same order. The whole world is the default group (None).
        """
        grid = WorkAssignment(self.world, self.grad_workers, ())
        groups: dict[tuple[int, ...], Any] = {}
        for ranks in grid.worker_groups() + grid.receiver_groups():
            if 1 < len(ranks) < self.world:
                groups[ranks] = dist.new_group(list(ranks))
            elif len(ranks) == self.world > 1:
                groups[ranks] = None
        return groups

    # ---- one step ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, lr: float) -> None:
        """Collective: update factors and decompositions when due, then precondition and KL-clip.

        Args:
            lr: the learning rate of the coming update (KL clipping bounds lr times the step).
        """
        if self.layers is None:
            self._keep_active()
        s = self.settings
        if self.steps % s.factor_every == 0:
            self._update_factors()
        if self.steps % s.inv_every == 0:
            self._update_decompositions()
        self._precondition(lr)
        self.steps += 1
        self._set_collect()

    def _keep_active(self, names: list[str] | None = None) -> None:
        """Keep the layers named (default: those whose hooks fired), unhook the rest, assign work."""
        keep = set(names) if names is not None else {c.name for c in self.candidates if c.fired}
        self.layers = [c for c in self.candidates if c.name in keep]
        for c in self.candidates:
            if c.name not in keep:
                c.remove()
        costs = [decomposition_cost(layer.n_a, layer.n_g) for layer in self.layers]
        self.assignment = WorkAssignment.greedy(
            costs, self.world, self.grad_workers, self.settings.speeds
        )

    def _set_collect(self) -> None:
        collect = self.steps % self.settings.factor_every == 0
        for c in self.candidates:
            c.collect = collect

    def _update_factors(self) -> None:
        """This batch's A and G of every layer, averaged over ranks, into the running factors."""
        assert self.layers is not None
        batch = [f for layer in self.layers for f in layer.batch_factors()]
        if self.world > 1:
            assert self.comm is not None
            # symmetric: the upper triangles carry everything, in one message
            flat = torch.cat([triu_pack(f) for f in batch])
            self.comm.all_reduce(flat, kind="kfac_factors").div_(self.world)
            sizes = [f.shape[0] for f in batch]
            batch = [
                triu_unpack(v, n)
                for v, n in zip(flat.split([n * (n + 1) // 2 for n in sizes]), sizes, strict=True)
            ]
        decay = self.settings.factor_decay
        for i, layer in enumerate(self.layers):
            layer.A = running_average(layer.A, batch[2 * i], decay)
            layer.G = running_average(layer.G, batch[2 * i + 1], decay)

    def _update_decompositions(self) -> None:
        """Each inverse worker decomposes its layers and broadcasts them to the layer's grad workers."""
        assert self.layers is not None and self.assignment is not None
        s, owner = self.settings, self.assignment.inv_workers
        for layer, rank in zip(self.layers, owner, strict=True):
            if rank == self.rank:
                assert layer.A is not None and layer.G is not None
                layer.decomposition = decompose(s.method, layer.A, layer.G, s.damping)
        if self.grad_workers == 1:  # MEM-OPT: the inverse worker is the only gradient worker
            return
        kind = METHODS[s.method]
        column = self.assignment.worker_groups()[self.rank % self.assignment.columns]
        for src in column:
            mine = [layer for layer, rank in zip(self.layers, owner, strict=True) if rank == src]
            if not mine:
                continue
            if src == self.rank:
                flat = torch.cat([layer.decomposition.pack() for layer in mine])  # type: ignore[union-attr]
            else:
                ref = mine[0].A
                assert ref is not None
                n = sum(kind.numel(layer.n_a, layer.n_g) for layer in mine)
                flat = torch.empty(n, dtype=ref.dtype, device=ref.device)
            self._broadcast(flat, src, column, "kfac_decompositions")
            if src != self.rank:
                parts = flat.split([kind.numel(layer.n_a, layer.n_g) for layer in mine])
                for layer, part in zip(mine, parts, strict=True):
                    layer.decomposition = kind.unpack(part, layer.n_a, layer.n_g)

    def _precondition(self, lr: float) -> None:
        """Grad workers precondition; the others receive by broadcast; everyone KL-clips the same."""
        assert self.layers is not None and self.assignment is not None
        a, damping = self.assignment, self.settings.damping
        grads = [layer.grad() for layer in self.layers]
        pre: list[Tensor | None] = [
            layer.decomposition.precondition(g, damping)  # type: ignore[union-attr]
            if a.is_grad_worker(i, self.rank)
            else None
            for i, (layer, g) in enumerate(zip(self.layers, grads, strict=True))
        ]
        if self.grad_workers < self.world:
            row = a.receiver_groups()[self.rank // a.columns]
            for src in row:
                sent = [i for i in range(len(grads)) if a.is_grad_worker(i, src)]
                if not sent:
                    continue
                if src == self.rank:
                    flat = torch.cat([pre[i].flatten() for i in sent])  # type: ignore[union-attr]
                else:
                    flat = grads[0].new_empty(sum(grads[i].numel() for i in sent))
                self._broadcast(flat, src, row, "kfac_gradients")
                if src != self.rank:
                    for i, part in zip(
                        sent, flat.split([grads[i].numel() for i in sent]), strict=True
                    ):
                        pre[i] = part.view_as(grads[i])
        pairs = [(p, g) for p, g in zip(pre, grads, strict=True) if p is not None]
        assert len(pairs) == len(grads), "every layer's preconditioned gradient is known here"
        nu = kl_clip_scale(pairs, lr, self.settings.kl_clip)
        for layer, (p, _) in zip(self.layers, pairs, strict=True):
            layer.set_grad(p * nu)

    def _broadcast(self, flat: Tensor, src: int, ranks: tuple[int, ...], kind: str) -> None:
        assert self.comm is not None
        self.comm.broadcast(flat, src, group=self._groups[ranks], kind=kind)

    # ---- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Steps, the active layers, their running factors and the decompositions this rank holds."""
        layers = self.layers or []
        return {
            "steps": self.steps,
            "layers": None if self.layers is None else [layer.name for layer in layers],
            "A": [layer.A for layer in layers],
            "G": [layer.G for layer in layers],
            "method": str(self.settings.method),  # a plain str: torch.load(weights_only=True)
            "decompositions": {
                layer.name: layer.decomposition.pack()
                for layer in layers
                if layer.decomposition is not None
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (tensors move to each layer's device).

        Raises:
            ValueError: the state names layers this model does not have.
        """
        self.steps = state["steps"]
        if state["layers"] is not None:
            known = {c.name: c for c in self.candidates}
            unknown = [n for n in state["layers"] if n not in known]
            if unknown:
                raise ValueError(f"K-FAC state names layers this model lacks: {unknown}")
            self._keep_active(state["layers"])
            kind = METHODS[KfacMethod(state["method"])]
            assert self.layers is not None
            for layer, a, g in zip(self.layers, state["A"], state["G"], strict=True):
                device = layer.module.weight.device  # type: ignore[union-attr]
                layer.A, layer.G = a.to(device), g.to(device)
                flat = state["decompositions"].get(layer.name)
                if flat is not None:
                    layer.decomposition = kind.unpack(flat.to(device), layer.n_a, layer.n_g)
        self._set_collect()
