"""What the strategies that shard the parameters (``fsdp``, ``tp``) share: a model's training copy built on the meta device, and the whole model gathered back on rank 0.

The engine hands every strategy its ``nn.Sequential`` and expects rank 0's to hold the
trained weights when ``fit`` returns (evaluation, checkpoints and the summary are written
once for all strategies). A sharding strategy trains a copy whose parameters are torch's
DTensors: the copy is made without memory (:func:`skeleton`), sharded, allocated as shards
and loaded with the model's weights (:func:`shard_copy`); the engine's model is freed to
the meta device meanwhile and gets the whole weights back on rank 0 (:func:`whole_model`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.tensor import DTensor

from deepjimu.models.parts import skeleton

__all__ = ["load_optimizer_state", "optimizer_state", "shard_copy", "whole_model"]


def shard_copy(
    model: nn.Module, shard: Callable[[nn.Module], None], device: torch.device
) -> nn.Module:
    """Collective: ``model``'s training copy, sharded by ``shard`` (in place, on its meta
    skeleton), allocated as this rank's shards on ``device`` and loaded with ``model``'s
    weights (every rank holds them: the worker built the model on each); ``model`` is
    then freed to the meta device."""
    copy_ = skeleton(model)
    shard(copy_)
    copy_.to_empty(device=device)
    set_model_state_dict(copy_, model.state_dict(), options=StateDictOptions(full_state_dict=True))
    model.to("meta")
    return copy_


def whole_model(
    sharded: nn.Module, model: nn.Module, main: bool, device: torch.device
) -> nn.Module | None:
    """Collective: ``sharded``'s weights gathered whole into ``model`` on the main rank (it is
    allocated on ``device`` again for them); None on the others."""
    full = get_model_state_dict(
        sharded, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if not main:
        return None
    model.to_empty(device=device)
    model.load_state_dict(full)
    return model


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
