"""Comm: the one byte counter and wait timer around torch.distributed messages."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Comm", "CommStats", "Pending", "nbytes", "sum_by_kind"]


def nbytes(t: Tensor) -> int:
    """Payload size of ``t`` in bytes, as it goes on the wire (its dtype, not float32).

    A sparse tensor (an embedding's gradient) goes as its indices and values: gloo's
    all-reduce of one all-gathers them, so its dense size would count bytes never sent.
    """
    if t.is_sparse:
        return nbytes(t._indices()) + nbytes(t._values())
    return t.numel() * t.element_size()


def sum_by_kind(counts: list[dict[str, int]]) -> dict[str, int]:
    """Per kind, the sum of ``counts`` (e.g. every rank's ``sent_by_kind``), kinds sorted."""
    out: dict[str, int] = {}
    for c in counts:
        for kind, n in c.items():
            out[kind] = out.get(kind, 0) + n
    return dict(sorted(out.items()))


@dataclass
class CommStats:
    """Counters of one rank. ``wait_s`` is time blocked on messages; ``compute_s`` the rest.

    ``sent_by_kind`` splits ``bytes_sent`` by the optional kind a message was labelled with
    (e.g. ``kfac_factors``); unlabelled bytes are only in the total.
    """

    bytes_sent: int = 0
    bytes_recv: int = 0
    wait_s: float = 0.0
    compute_s: float = 0.0
    messages: int = 0
    sent_by_kind: dict[str, int] = field(default_factory=dict)

    def as_list(self) -> list[float]:
        return [float(self.bytes_sent), float(self.bytes_recv), self.compute_s, self.wait_s]


class Pending:
    """An outstanding non-blocking message; :meth:`wait` counts the blocked time."""

    def __init__(self, work: dist.Work | None, stats: CommStats, sync: bool) -> None:
        self._work, self._stats, self._sync = work, stats, sync

    def wait(self) -> None:
        if self._work is None:
            return
        t0 = time.perf_counter()
        self._work.wait()
        if self._sync:
            torch.cuda.synchronize()
        self._stats.wait_s += time.perf_counter() - t0
        self._work = None


class Comm:
    """Point-to-point and collective messages of one rank, counted where they are sent.

    Every byte a strategy moves goes through here (or through :meth:`count` for messages
    that a library sends: DDP's all-reduce buckets, pipelining's P2P ops), so
    ``bytes_sent`` / ``bytes_recv`` are the real payloads. For a collective the payload
    handed to it is counted once as sent and once as received; the wire traffic of the
    collective's algorithm is not guessed. In a group of one rank nothing is counted:
    nothing leaves the process.

    Example:
        >>> comm = Comm(CommStats())
        >>> comm.send(torch.ones(4), dst=1)  # doctest: +SKIP
    """

    def __init__(self, stats: CommStats, group: dist.ProcessGroup | None = None) -> None:
        self.stats = stats
        self.group = group
        self._world: int | None = None  # the group's size, once known (_alone)

    def _sync(self, t: Tensor) -> bool:
        return t.is_cuda

    def _alone(self) -> bool:
        """True if the Comm's group has one rank (no group at all: a count in a test)."""
        if self._world is None:
            if not dist.is_initialized():
                return False
            self._world = dist.get_world_size(self.group)
        return self._world == 1

    def count(self, sent: int = 0, recv: int = 0, kind: str | None = None) -> None:
        """Record bytes that a library moved on this rank's behalf (``kind``: an optional label).

        In a group of one rank nothing moves (a collective there is a local copy at most),
        so nothing is counted.
        """
        if self._alone():
            return
        self.stats.bytes_sent += sent
        self.stats.bytes_recv += recv
        self.stats.messages += 1
        if kind is not None:
            self.stats.sent_by_kind[kind] = self.stats.sent_by_kind.get(kind, 0) + sent

    def isend(self, t: Tensor, dst: int, kind: str | None = None) -> Pending:
        """Start sending ``t`` to rank ``dst`` (its rank in the Comm's group)."""
        self.count(sent=nbytes(t), kind=kind)
        work = dist.isend(t, group=self.group, group_dst=dst)
        return Pending(work, self.stats, self._sync(t))

    def irecv(self, t: Tensor, src: int) -> Pending:
        """Start receiving into ``t`` from rank ``src`` (its rank in the Comm's group)."""
        self.count(recv=nbytes(t))
        return Pending(dist.irecv(t, group=self.group, group_src=src), self.stats, self._sync(t))

    def send(self, t: Tensor, dst: int) -> None:
        """Send ``t`` to ``dst`` and wait until it is out."""
        self.isend(t, dst).wait()

    def recv(self, t: Tensor, src: int) -> Tensor:
        """Receive into ``t`` from ``src``; the time blocked counts as wait."""
        self.irecv(t, src).wait()
        return t

    def all_reduce(
        self, t: Tensor, kind: str | None = None, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> Tensor:
        """Sum ``t`` (or reduce it by ``op``) in place over every rank of the group; the time
        blocked counts as wait."""
        self.count(sent=nbytes(t), recv=nbytes(t), kind=kind)
        work = dist.all_reduce(t, op=op, group=self.group, async_op=True)
        Pending(work, self.stats, self._sync(t)).wait()
        return t

    def broadcast(
        self, t: Tensor, src: int, group: dist.ProcessGroup | None = None, kind: str | None = None
    ) -> Tensor:
        """Copy ``t`` of rank ``src`` (a global rank) into ``t`` on every rank of ``group``.

        ``src`` counts ``t`` as sent, the others as received; ``group`` defaults to the
        Comm's own group.
        """
        mine = dist.get_rank() == src
        if group is None or dist.get_world_size(group) > 1:
            self.count(sent=nbytes(t) if mine else 0, recv=0 if mine else nbytes(t), kind=kind)
        work = dist.broadcast(
            t, src, group=group if group is not None else self.group, async_op=True
        )
        Pending(work, self.stats, self._sync(t)).wait()
        return t
