"""The strategies: each its module (or package) here, and one entry in :mod:`~deepjimu.strategies.registry`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepjimu.strategies.registry import entry, strategy_names

if TYPE_CHECKING:
    from deepjimu.strategies.base import Strategy

__all__ = ["get_strategy", "strategy_names"]


def get_strategy(name: str) -> type[Strategy]:
    """The Strategy class registered as ``name`` (its module imported now).

    Raises:
        JimuError: no such strategy.
    """
    found: type[Strategy] = entry(name).load()
    return found
