"""Strategy registry: name -> class, imported on first use so start-up stays light."""

from __future__ import annotations

import importlib

from deepjimu.errors import JimuError
from deepjimu.strategies.base import FitResult, GradientStrategy, Strategy

__all__ = ["FitResult", "GradientStrategy", "Strategy", "get_strategy", "strategy_names"]

_REGISTRY: dict[str, str] = {
    "local": "deepjimu.strategies.local:LocalStrategy",
    "ddp": "deepjimu.strategies.ddp:DDPStrategy",
    "model-parallel": "deepjimu.strategies.model_parallel:ModelParallelStrategy",
    "pipeline": "deepjimu.strategies.pipeline:PipelineStrategy",
    "admm": "deepjimu.strategies.admm.strategy:AdmmStrategy",
}


def strategy_names() -> list[str]:
    """Registered strategy names, in registry order."""
    return list(_REGISTRY)


def get_strategy(name: str) -> type[Strategy]:
    """The Strategy class registered as ``name``.

    Raises:
        JimuError: no such strategy.
    """
    if name not in _REGISTRY:
        raise JimuError(f"unknown strategy {name!r} (known: {', '.join(_REGISTRY)})")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]
