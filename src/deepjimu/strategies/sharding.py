"""What the strategies that shard the parameters (``fsdp``, ``tp``) share: a training copy sharded before it is allocated, loaded a tensor at a time, so that no rank ever holds the whole model.

A sharding strategy trains a copy of the model whose parameters are torch's DTensors: the
copy is made without memory (:func:`~deepjimu.models.parts.skeleton`), sharded, and
allocated as this rank's shards (:func:`sharded_skeleton`). Its weights come in one block or
one tensor at a time (:func:`load_shards`): from each block as the worker builds the model
in parts (:func:`sharding_place`), from a model built whole (:func:`shard_copy`: a
factory's, or a spec that is not built a block at a time), or from a checkpoint. Each rank
checkpoints its own shards (``record.checkpoint``), so no rank gathers the whole model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

from deepjimu.choices import Optimizer
from deepjimu.models.parts import Place, skeleton
from deepjimu.options import DdpOptions, GradientOptions
from deepjimu.strategies.base import GradientStrategy, ProbeStep, probed_options
from deepjimu.strategies.registry import entry

if TYPE_CHECKING:
    from deepjimu.data import DataSplits
    from deepjimu.run import Run

__all__ = [
    "ShardedModel",
    "load_optimizer_state",
    "load_shards",
    "optimizer_state",
    "shard_copy",
    "sharded_skeleton",
    "sharding_place",
]


def sharded_skeleton(
    model: nn.Module, shard: Callable[[nn.Module], None], device: torch.device
) -> nn.Module:
    """Collective: a training copy of ``model`` (whose weights are not read: its blocks may be
    on the meta device), sharded by ``shard`` (in place, on its meta skeleton) and allocated
    as this rank's shards on ``device``, not yet loaded (:func:`load_shards`)."""
    copy_ = skeleton(model)
    shard(copy_)
    copy_.to_empty(device=device)
    return copy_


def load_shards(sharded: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Load whole tensors into ``sharded``'s shards, one key of ``state`` at a time (so a
    mapping that reads each from disk as it is asked holds one at a time): each rank keeps
    its own piece of a DTensor (``distribute_tensor`` without a source rank: every rank holds
    the same whole tensor, nothing is sent) and the whole of a plain one."""
    targets = dict(sharded.named_parameters()) | dict(sharded.named_buffers())
    with torch.no_grad():
        for key in state:
            target = targets[key]
            whole = state[key].to(device=target.device, dtype=target.dtype)
            if isinstance(target, DTensor):
                whole = distribute_tensor(
                    whole, target.device_mesh, target.placements, src_data_rank=None
                )
            target.copy_(whole)


def sharding_place(sharded: nn.Module) -> Place:
    """The ``Place`` of a worker that builds its model in parts for ``sharded`` (made from
    the model's shapes): each block's weights, as they are drawn, loaded into its shards and
    the block freed at once."""

    def place(index: int, block: nn.Module) -> nn.Module:
        load_shards(sharded, {f"{index}.{k}": v for k, v in block.state_dict().items()})
        return block.to("meta")

    return place


def shard_copy(
    model: nn.Module, shard: Callable[[nn.Module], None], device: torch.device
) -> nn.Module:
    """Collective: the training copy of a model built whole on every rank
    (:func:`sharded_skeleton`), loaded with ``model``'s weights; ``model`` is then freed to
    the meta device."""
    copy_ = sharded_skeleton(model, shard, device)
    load_shards(copy_, model.state_dict())
    model.to("meta")
    return copy_


class ShardedModel:
    """What the sharding strategies (``fsdp``, ``tp``) share as strategies, ahead of their
    ``GradientStrategy`` base: the training copy made by the strategy's :meth:`_shard`, built
    in parts by the worker (:meth:`placer`) or copied from a model built whole, loaded from
    the resumed checkpoint a tensor at a time (:meth:`training_copy`); each rank checkpoints
    its shards and its shard of the optimizer's state."""

    name: ClassVar[str]
    _built: nn.Module | None = None  # the training copy, where the worker built it in parts
    sharded: nn.Module
    optimizer: torch.optim.Optimizer

    def _shard(self, model: nn.Sequential, run: Run, whole: bool) -> nn.Module:
        """The training copy of ``model`` (loaded with its weights where it is built
        ``whole``, else from its shapes alone)."""
        raise NotImplementedError

    @classmethod
    def probe_step(
        cls, cfg: DdpOptions, world: int, data: DataSplits, n_blocks: int, rows: int
    ) -> ProbeStep | None:
        """The strategy's own step over the probed ranks, on the rows a rank of its run
        steps on (a data-sharding one's: the probe's own ``rows``; else the whole batch),
        with the run's optimizer (not K-FAC, which it does not take): from it the planner
        solves what the DTensors' runtime adds per sharded unit, which no fitted link
        prices (without it fsdp x2 and tp x2 on mlp:256x3 were predicted 3.1-4.1x their
        measured rate). None where the strategy refuses the probed model."""
        if cfg.optimizer == Optimizer.KFAC:
            return None
        options = GradientOptions(**probed_options(cfg, cls.name, world))
        strategy = cls(options)  # type: ignore[call-arg]
        assert isinstance(strategy, GradientStrategy)
        if strategy.problems(options, n_blocks):
            return None
        whole = min(cfg.batch_size, data.train_size)
        batch = rows if entry(cls.name).traits.shards_data else whole
        return ProbeStep(strategy, lambda: batch, lambda: ([], batch, 1))  # type: ignore[call-arg]

    def placer(self, model: nn.Sequential, data: DataSplits, run: Run) -> Place:
        """Collective: the training copy made from ``model``'s shapes, each block loaded into
        it as the worker draws it."""
        self._built = self._shard(model, run, whole=False)
        return sharding_place(self._built)

    def training_copy(self, model: nn.Sequential, run: Run) -> nn.Module:
        """Collective: the training copy, copied from ``model`` built whole (which the worker
        loaded with a resumed run's weights), or as the worker built it in parts, a resumed
        run's weights then loaded into it a tensor at a time (no rank holds the whole
        model: the worker's model is all on the meta device)."""
        built = self._built
        if built is None:
            return self._shard(model, run, whole=True)
        if run.resumed is not None:
            load_shards(built, run.resumed.model_state)
        return built

    def full_model(self, run: Run) -> nn.Module | None:
        """Every rank's sharded model: each checkpoints its own shards."""
        return self.sharded

    def rank_state(self) -> dict[str, Any]:
        """This rank's shard of the optimizer's state."""
        return {"optimizer": optimizer_state(self.optimizer)}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        load_optimizer_state(self.optimizer, state["optimizer"])


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's optimizer state with every DTensor as its local shard: a checkpoint holds
    plain tensors (it is read back with ``weights_only``)."""

    def local(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: local(v) for k, v in value.items()}
        return value.to_local() if isinstance(value, DTensor) else value

    return local(optimizer.state_dict())  # type: ignore[no-any-return]


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load :func:`optimizer_state`'s ``state``: each local shard becomes a DTensor laid out
    as the parameter it belongs to."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    per_param = {}
    for index, values in state["state"].items():
        p = params[index]
        per_param[index] = {
            k: _like(v, p) if isinstance(p, DTensor) and isinstance(v, Tensor) and v.dim() else v
            for k, v in values.items()
        }
    optimizer.load_state_dict({**state, "state": per_param})


def _like(local: Tensor, param: DTensor) -> DTensor:
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
        stride=param.stride(),
    )  # fmt: skip
