"""The machines a plan is made for: devices, links, and ring costs of the collectives over them.

Pure: no torch, no process group. A :class:`Cluster` comes from a TOML file
(:func:`deepjimu.cost.cluster_file.read_cluster`, examples in ``examples/clusters/``) or from a probe's measured links
(:func:`links_from_probe`). Ranks are placed node by node: rank r runs on node
``r // ranks_per_node``, so p ranks span more than one node once p > ``ranks_per_node``.

Collectives follow the ring algorithm (Patarasuk and Yuan 2009; what NCCL and gloo run for
large messages). Over a ring of p ranks whose slowest hop sends n bytes in
alpha + n / B seconds:

- all-reduce of n bytes: 2(p-1) alpha + 2(p-1)/p n / B
- all-gather of n bytes per rank: (p-1) alpha + (p-1) n / B
- reduce-scatter of n bytes: (p-1) alpha + (p-1)/p n / B
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from deepjimu.errors import JimuError

__all__ = ["PRECISIONS", "Cluster", "Device", "Link", "links_from_probe", "probed_cluster"]


PRECISIONS = ("fp32", "tf32", "bf16")
"""The matmul precisions a device's peak may be given for (``--precision``'s values)."""


@dataclass(frozen=True)
class Device:
    """One rank's device: its peak dense matmul rate per precision and its memory.

    ``efficiency``: the fraction of peak real layers reach (our H200 measurement: fp32
    matmuls at 55-75% of peak). ``speed``: this rank's speed relative to the others, for
    heterogeneous workers.

    Example:
        >>> Device("toy", {"fp32": 1e12}, 2**30, efficiency=0.5).matmul_s(1e12)
        2.0
    """

    name: str
    flops: dict[str, float]
    memory_bytes: int
    efficiency: float = 0.6
    speed: float = 1.0

    def matmul_s(self, flops: float, precision: str = "fp32") -> float:
        """Seconds this device takes for ``flops`` matmul FLOPs at ``precision``.

        Args:
            flops: floating-point operations (2 m n k for an m x k by k x n product).
            precision: one of the device's :attr:`flops` keys.

        Returns:
            flops / (peak * efficiency * speed).

        Raises:
            JimuError: the device has no peak figure for ``precision``.
        """
        peak = self.flops.get(precision)
        if peak is None:
            raise JimuError(
                f"device {self.name!r} has no {precision} peak (precision: {precision!r}; "
                f"known: {', '.join(self.flops)})"
            )
        return flops / (peak * self.efficiency * self.speed)


@dataclass(frozen=True)
class Link:
    """One hop: a message of n bytes takes ``alpha_s`` + n / ``bytes_per_s``.

    Example:
        >>> Link(alpha_s=1e-6, bytes_per_s=1e9).seconds(1000)
        2e-06
    """

    alpha_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        """Time of one message of ``nbytes`` over this hop."""
        return self.alpha_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class Cluster:
    """Nodes of identical devices, the link inside a node and the link between nodes.

    ``cores_per_node``: for CPU clusters, the cores a node's ranks share (None for GPUs).
    ``collectives``: per-hop links a probe measured per collective (keys as
    :attr:`deepjimu.cost.probe.Probe.links`); one overrides ``intra`` for its
    collective. ``source``: ``"probe"`` or the TOML path, for printing. ``action_s``: per
    split-model strategy (``pipeline``, ``model-parallel``), the seconds its runtime adds to
    each forward or backward action, and per sharding one (``fsdp``, ``tp``) to each
    sharded unit's step, solved from a probe's step of that strategy; ``<name>:replicas``,
    what the sharding of its ``--replicas`` pays per unit (set from its registry entry).

    Example:
        >>> gpu = Device("g", {"fp32": 1e12}, 2**30)
        >>> c = Cluster("toy", 2, 4, gpu, intra=Link(0.0, 1e9), inter=Link(0.0, 1e8))
        >>> c.world, c.node_of(5), c.all_reduce_s(10**6, 4), c.all_reduce_s(10**6, 8)
        (8, 1, 0.0015, 0.0175)

    Raises:
        JimuError: ``nodes``, ``ranks_per_node`` or ``cores_per_node`` below 1, or no
            ``inter`` link for more than one node.
    """

    name: str
    nodes: int
    ranks_per_node: int
    device: Device
    intra: Link
    inter: Link | None  # needed when nodes > 1
    cores_per_node: int | None = None
    collectives: dict[str, Link] = field(default_factory=dict)
    source: str = ""
    sync_s: dict[int, float] = field(default_factory=dict)
    ddp_sync_s: dict[int, float] = field(default_factory=dict)
    action_s: dict[str, float] = field(default_factory=dict)
    speeds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        where = self.source or f"cluster {self.name!r}"
        if self.speeds and (
            len(self.speeds) != self.world or any(not 0 < v <= 1 for v in self.speeds)
        ):
            raise JimuError(
                f"{where}: speeds must give one factor in (0, 1] per rank, {self.world} in all "
                f"(speeds: {list(self.speeds)})"
            )
        for key in ("nodes", "ranks_per_node", "cores_per_node"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise JimuError(f"{where}: {key} must be >= 1 ({key}: {value})")
        if self.nodes > 1 and self.inter is None:
            raise JimuError(
                f"{where}: inter is missing; {self.nodes} nodes need a link between them "
                f"(nodes: {self.nodes})"
            )

    @property
    def world(self) -> int:
        """The number of ranks: nodes * ranks_per_node."""
        return self.nodes * self.ranks_per_node

    @property
    def gpus(self) -> bool:
        """Whether its ranks are GPUs: a CPU node's cores are given (``cores_per_node``),
        a GPU node's are not asked."""
        return self.cores_per_node is None

    def rank_speeds(self, p: int) -> list[float]:
        """The speeds of ranks 0..p-1 (1 each unless :attr:`speeds` says otherwise): a
        rank at speed 0.5 takes twice as long for the same work (a mixed cluster, or
        ``--emulate-speeds``)."""
        return list(self.speeds[:p]) if self.speeds else [1.0] * p

    def node_of(self, rank: int) -> int:
        """The node of ``rank`` (ranks are placed node by node).

        Raises:
            JimuError: ``rank`` outside 0..world-1.
        """
        if not 0 <= rank < self.world:
            raise JimuError(
                f"rank must be in 0..{self.world - 1} on cluster {self.name!r} (rank: {rank})"
            )
        return rank // self.ranks_per_node

    def _check_p(self, p: int) -> None:
        if not 1 <= p <= self.world:
            raise JimuError(
                f"ranks taking part must be 1..{self.world} on cluster {self.name!r} (p: {p})"
            )

    def hop(self, collective: str, p: int) -> Link:
        """The slowest hop of a ring over ranks 0..p-1.

        Args:
            collective: a probe collective name (``"all_reduce"``, ``"all_gather"``, ...).
            p: ranks taking part.

        Returns:
            ``inter`` when the ranks span more than one node, else the probe's link for
            ``collective`` if measured, else ``intra``.

        Raises:
            JimuError: p outside 1..world.
        """
        self._check_p(p)
        if p > self.ranks_per_node:
            assert self.inter is not None  # __post_init__: more than one node has inter
            return self.inter
        return self.collectives.get(collective, self.intra)

    def all_reduce_s(self, nbytes: int, p: int, collective: str = "all_reduce") -> float:
        """Ring all-reduce of ``nbytes`` (per rank) over p ranks: 2(p-1) alpha + 2(p-1)/p n / B.

        Returns:
            Seconds; 0 for p == 1.

        Raises:
            JimuError: p outside 1..world.
        """
        h = self.hop(collective, p)
        if p == 1:
            return 0.0
        return 2 * (p - 1) * h.alpha_s + 2 * (p - 1) / p * nbytes / h.bytes_per_s

    def all_gather_s(self, nbytes_per_rank: int, p: int, collective: str = "all_gather") -> float:
        """Ring all-gather of ``nbytes_per_rank`` from each of p ranks: (p-1) alpha + (p-1) n / B.

        Returns:
            Seconds; 0 for p == 1.

        Raises:
            JimuError: p outside 1..world.
        """
        h = self.hop(collective, p)
        if p == 1:
            return 0.0
        return (p - 1) * h.alpha_s + (p - 1) * nbytes_per_rank / h.bytes_per_s

    def reduce_scatter_s(self, nbytes: int, p: int, collective: str = "all_reduce") -> float:
        """Ring reduce-scatter of ``nbytes`` over p ranks: (p-1) alpha + (p-1)/p n / B.

        Half a ring all-reduce, so its hop is the all-reduce's by default.

        Returns:
            Seconds; 0 for p == 1.

        Raises:
            JimuError: p outside 1..world.
        """
        h = self.hop(collective, p)
        if p == 1:
            return 0.0
        return (p - 1) * h.alpha_s + (p - 1) / p * nbytes / h.bytes_per_s

    def all_reduce_over_s(
        self, nbytes: int, ranks: Sequence[int], collective: str = "all_reduce"
    ) -> float:
        """Ring all-reduce of ``nbytes`` (per rank) among ``ranks``, which need not be
        neighbours (the column of a stage under ``--replicas``: ranks K apart): over
        ``inter`` when they span more than one node, else as :meth:`all_reduce_s`'s ring.

        Raises:
            JimuError: a rank outside 0..world-1.
        """
        p = len(ranks)
        if p <= 1:
            return 0.0
        if len({self.node_of(r) for r in ranks}) > 1:
            assert self.inter is not None  # two nodes: __post_init__ required inter
            h = self.inter
        else:
            h = self.collectives.get(collective, self.intra)
        return 2 * (p - 1) * h.alpha_s + 2 * (p - 1) / p * nbytes / h.bytes_per_s

    def p2p_s(self, nbytes: int, src: int, dst: int) -> float:
        """One message of ``nbytes`` from rank ``src`` to rank ``dst``: alpha + n / B.

        Returns:
            Seconds over ``intra`` on one node, ``inter`` across nodes; 0 when src == dst.

        Raises:
            JimuError: a rank outside 0..world-1.
        """
        a, b = self.node_of(src), self.node_of(dst)
        if src == dst:
            return 0.0
        link = self.intra if a == b else self.inter
        assert link is not None  # two nodes: __post_init__ required inter
        return link.seconds(nbytes)

    def _busiest_node_ranks(self, p: int) -> int:
        self._check_p(p)
        return min(p, self.ranks_per_node)  # node by node: node 0 fills first

    def threads_per_rank(self, p: int) -> int | None:
        """CPU threads each rank runs when p ranks run at once: cores_per_node // ranks on
        the busiest node, at least 1 (``--threads``' default rule); None for GPU clusters.

        Raises:
            JimuError: p outside 1..world.
        """
        busiest = self._busiest_node_ranks(p)
        if self.cores_per_node is None:
            return None
        return max(1, self.cores_per_node // busiest)

    def sync_penalty_s(self, p: int) -> float:
        """Seconds each synchronisation of p ranks loses beyond their fair share of the
        cores: measured by a probe (:attr:`sync_s`, per ranks on a node), else 0."""
        return self.sync_s.get(self._busiest_node_ranks(p), 0.0)

    def ddp_sync_penalty_s(self, p: int) -> float:
        """Seconds a ddp step's all-reduce over p ranks takes beyond its fitted time: the
        ranks reach it at different moments, and where they time-share cores the one still
        computing holds the others' ring back (3 ranks on 2 cores: 3-4 ms a step). Measured
        by a probe of p ranks (:attr:`ddp_sync_s`, from its ddp step over its own group),
        else 0."""
        return self.ddp_sync_s.get(p, 0.0)

    def ranks_sharing_cores(self, p: int) -> float:
        """How much slower each rank computes when p ranks run at once on a CPU cluster.

        The rule: the device's ``flops`` is one rank's rate on a core of its own. A node
        whose k ranks exceed its cores time-shares them, so each rank runs k / cores times
        slower; up to one rank per core nothing slows. A rank left more than one core
        (:meth:`threads_per_rank` > 1) is not credited with the extra threads: small
        layers scale poorly over threads, and the planner should not promise a speed-up
        that a single worker does not see.

        Example:
            >>> cpu = Device("cpu", {"fp32": 1e11}, 2**30, efficiency=1.0)
            >>> c = Cluster("vm", 1, 3, cpu, Link(5e-5, 2.5e9), None, cores_per_node=2)
            >>> c.ranks_sharing_cores(2), c.ranks_sharing_cores(3)
            (1.0, 1.5)

        Ranks that synchronise on time-shared cores also wait for the one the scheduler
        ran last, once per synchronisation: :meth:`sync_penalty_s`.

        Returns:
            max(1, ranks on the busiest node / cores_per_node); 1.0 for GPU clusters.

        Raises:
            JimuError: p outside 1..world.
        """
        busiest = self._busiest_node_ranks(p)
        if self.cores_per_node is None:
            return 1.0
        return max(1.0, busiest / self.cores_per_node)


class _AlphaBeta(Protocol):
    """A fit t(n) = alpha + beta n, as :class:`deepjimu.cost.probe.LinkFit`."""

    @property
    def alpha_s(self) -> float: ...

    @property
    def beta_s_per_byte(self) -> float: ...


def links_from_probe(links: Mapping[str, _AlphaBeta], world: int) -> dict[str, Link]:
    """Per-hop links from a probe's fits t(n) = alpha + beta n, each measured over a ring of
    ``world`` ranks (``Probe.links``, ``Probe.world``).

    An all-reduce (``all_reduce*``) fit gives alpha_hop = alpha / (2(p-1)) and
    B = 2(p-1)/p / beta; an all-gather (``all_gather*``) fit gives alpha_hop = alpha / (p-1)
    and B = (p-1) / beta; a ``reduce_scatter`` fit alpha / (p-1) and B = (p-1)/p / beta. So :meth:`Cluster.all_reduce_s` at p = ``world`` gives back the
    fit, and other p follow the ring. A fit whose time did not grow with size (beta 0)
    gives an infinite bandwidth, as :attr:`LinkFit.gbit_per_s` does.

    Args:
        links: collective name -> fit with ``alpha_s`` and ``beta_s_per_byte``.
        world: the ranks the probe ran on.

    Returns:
        collective name -> :class:`Link`, for :attr:`Cluster.collectives`.

    Raises:
        JimuError: ``world`` below 2 (one rank measures no link), or a collective that is
            neither an all-reduce nor an all-gather.

    Example:
        >>> from deepjimu.cost.probe import LinkFit
        >>> hop = links_from_probe({"all_gather": LinkFit(3e-4, 1e-9)}, world=4)["all_gather"]
        >>> round(hop.alpha_s * 1e6, 6), round(hop.bytes_per_s / 1e9, 6)  # us, GB/s
        (100.0, 3.0)
    """
    p = world
    if p < 2:
        raise JimuError(
            f"a probe on one worker measures no link; probe with 2 or more workers (world: {p})"
        )
    out = {}
    for name, fit in links.items():
        if name.startswith("all_reduce"):
            hops, share = 2 * (p - 1), 2 * (p - 1) / p
        elif name.startswith("all_gather"):
            hops, share = p - 1, float(p - 1)
        elif name == "reduce_scatter":  # half a ring all-reduce
            hops, share = p - 1, (p - 1) / p
        elif name == "p2p":  # one message between two ranks: the hop itself
            hops, share = 1, 1.0
        else:
            raise JimuError(
                f"probe link {name!r} is none of all_reduce, all_gather, reduce_scatter or p2p (link: {name!r})"
            )
        beta = fit.beta_s_per_byte
        out[name] = Link(fit.alpha_s / hops, share / beta if beta > 0 else math.inf)
    return out


def probed_cluster(
    links: Mapping[str, _AlphaBeta], world: int, device: str, cores: int | None = None
) -> Cluster:
    """One node of ``world`` ranks whose collectives are a probe's fits (:func:`links_from_probe`).

    A point-to-point message takes the probe's ``p2p`` fit (a probe file from before it was
    timed: one hop of the all-gather's ring). The device has no FLOP figures: compute on a
    probed cluster is measured, not derived.

    Args:
        links: the probe's fits; world: its ranks; device: where it ran ("cpu", "cuda:0").
        cores: the node's cores that its ranks share (CPU), None on GPUs.
    """
    hops = links_from_probe(links, world)
    return Cluster(
        name=f"this machine ({device}" + (f", {cores} cores)" if cores else ")"),
        nodes=1,
        ranks_per_node=world,
        device=Device(name=device, flops={"fp32": 1.0}, memory_bytes=0),
        intra=hops.get("p2p", hops["all_gather"]),
        inter=None,
        cores_per_node=cores,
        collectives=hops,
        source="probe",
    )
