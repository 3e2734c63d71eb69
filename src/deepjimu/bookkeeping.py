"""Bookkeeping collectives: barrier, gather and broadcast of small Python objects, not counted as traffic."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["Bookkeeping"]


class Bookkeeping:
    """The object collectives a run's bookkeeping needs, over the default process group (or ``group``).

    Events, checkpoints and summaries move small Python objects between ranks (figures,
    counters, which files a rank can read); those messages are not the strategy's training
    traffic, so they bypass :class:`~deepjimu.comm.Comm`'s byte counter. Every method is
    collective: every rank calls it at the same point. With ``world`` 1 each returns at
    once and no process group is needed.

    Args:
        world: the number of ranks in the group.
        group: the process group (None: the default one); ranks are the group's.

    Example:
        >>> Bookkeeping(world=1).gather_objects({"loss": 0.5})
        [{'loss': 0.5}]
    """

    def __init__(self, world: int, group: dist.ProcessGroup | None = None) -> None:
        self.world, self.group = world, group

    def barrier(self) -> None:
        """Collective: wait for every rank."""
        if self.world > 1:
            dist.barrier(group=self.group)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Collective: every rank's ``obj``, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Collective: ``obj`` of rank ``src`` on every rank (the others' ``obj`` is ignored)."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=src)
        return box[0]
