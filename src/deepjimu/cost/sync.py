"""The per-tensor synchronisation plan of ddp (``--sync-plan``): each method's messages, their predicted time, and the choice.

Pure: no torch, no process group. For every parameter tensor (n float32 entries, p ranks)
the methods and the messages one rank hands to collectives per step are:

- ``allreduce``: a ring all-reduce of 4n bytes (a sparse gradient is made dense first);
  tensors under :data:`~deepjimu.compress.payload.FUSE_BYTES` travel together, as torch's DDP buckets them, in one
  all-reduce at the end of the backward pass. Each is priced at its marginal cost, its
  bytes' share of that message's time beyond the latency; the latency is paid once per
  step by the plan, whichever tensors share the message (:attr:`Option.shared_s`). So a
  tiny tensor does not move to another method on a probe's noise: once the message goes,
  adding it costs its bytes alone. Whether the message goes at all is decided for the
  whole plan (:func:`plan_sync`);
- ``ps``, a sharded parameter server: the gradient, padded to a multiple of p, is
  reduce-scattered so that rank r owns (sums) shard r, which is averaged and all-gathered
  back: 4n' bytes reduce-scattered and 4n'/p all-gathered (n' = n rounded up to p);
- ``sfb``, sufficient factors (Poseidon), for an ``nn.Linear`` weight of M x N at K input
  rows per rank and step: every rank all-gathers its inputs A (K x N) and output gradients
  G (K x M) in one message of 4K(M + N) bytes, and adds the other ranks' G^T A to its own
  gradient (a matmul of 2 M N (p-1) K FLOPs, measured: ``rebuild_s``);
- ``sparse``, for an embedding weight of V x D with a sparse gradient touching k rows per
  rank and step: all-gather the row counts (8 bytes), then k_max rows of one int32 index
  and D float32 values each: 4 k (D + 1) bytes. Where the backend all-reduces sparse
  tensors itself (gloo; ``TensorInfo.native``), the rows go to it, as torch's DDP hands
  them: it all-gathers the counts, then the int64 indices (8 k bytes) and the values
  (4 k D) in one call, and sums; NCCL has no sparse all-reduce.

A message's time is the cluster's ring collective (:class:`~deepjimu.cost.cluster.Cluster`,
on this machine the probe's fits; an all-gather timed at its own size replaces the fit,
as for ``--compress``: :func:`deepjimu.cost.ddp.message_s`). With a pure bandwidth model
(no latency, one bandwidth B per hop) all-reduce takes 2(p-1)/p 4MN/B and the factors
(p-1) 4K(M+N)/B, so SFB is the faster exactly when p K (M + N) < 2 M N, Poseidon's rule;
the planner decides by the predicted times, which add each collective's latency and the
measured rebuild.

**Why a sharded server rather than dedicated server ranks.** Dedicated servers need
processes (and, to be worth it, machines) beyond the workers, and with s servers for p
workers each server's link carries 2np/s bytes a step, the bottleneck unless s ~ p. The
server sharded over the workers themselves is that s = p case with no extra process: each
rank owns 1/p of every tensor, every worker pushes each shard to its owner
(reduce-scatter) and pulls the averaged shards back (all-gather), the traffic of a
parameter server with p shards. The optimizer stays replicated (every rank updates the
whole tensor from the averaged gradient), so the result is DDP's to the last rounding.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from deepjimu.compress.payload import COUNT_BYTES, FUSE_BYTES, fuses
from deepjimu.cost.cluster import Cluster
from deepjimu.cost.ddp import message_s
from deepjimu.errors import JimuError
from deepjimu.units import format_bytes

__all__ = [
    "COUNT_BYTES",
    "FUSE_BYTES",
    "METHODS",
    "PLANS",
    "TRIAL_MAJORITY",
    "TRIAL_MARGIN",
    "Option",
    "SyncEntry",
    "SyncTrial",
    "TensorInfo",
    "applicable",
    "format_plan",
    "method_messages",
    "plan_sync",
    "plan_to_dict",
    "price",
    "total_s",
]

METHODS = ("allreduce", "ps", "sfb", "sparse")
"""The methods, in the order that breaks a tie of predicted times (the plainer first)."""
PLANS = ("auto", *METHODS)
"""``--sync-plan``'s values: auto (per tensor, the fastest predicted method) or one method."""

KINDS = ("dense", "linear", "embedding")
_F32 = 4
_INDEX = 8  # one int64 row index (sparse, the backend's own all-reduce)


@dataclass(frozen=True)
class TensorInfo:
    """One parameter tensor as the planner sees it.

    ``kind``: ``linear`` (an ``nn.Linear`` weight, out x in), ``embedding`` (an embedding
    weight with sparse gradients, rows x dim) or ``dense`` (anything else). ``rows``:
    linear, the input rows per rank and step (the batch, times the positions of a
    sequence); embedding, the rows a step's gradient touches on the busiest rank.
    ``rebuild_s``: linear, the measured time of adding the other ranks' factors.
    ``native``: embedding, the backend all-reduces sparse tensors itself (gloo).
    """

    name: str
    shape: tuple[int, ...]
    kind: str = "dense"
    rows: float = 0.0
    rebuild_s: float = 0.0
    native: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)} (kind: {self.kind!r})")
        if self.kind in ("linear", "embedding") and len(self.shape) != 2:
            raise ValueError(f"a {self.kind} weight is 2-D (shape: {self.shape})")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Option:
    """One method for one tensor: its messages (collective, bytes per rank), predicted seconds and bytes sent.

    ``shared_s``: a cost paid once per step by every option that has it, not by each (the
    fused all-reduce's latency); ``seconds`` leaves it out.
    """

    method: str
    seconds: float
    nbytes: int
    messages: tuple[tuple[str, int], ...] = ()
    shared_s: float = 0.0


def total_s(options: Sequence[Option]) -> float:
    """The step's seconds of these options together: their own seconds, and each shared cost once.

    Example:
        >>> fused = [Option("allreduce", 1.0, 4, shared_s=5.0), Option("allreduce", 2.0, 8, shared_s=5.0)]
        >>> total_s([*fused, Option("sfb", 3.0, 16)])
        11.0
    """
    return sum(o.seconds for o in options) + max((o.shared_s for o in options), default=0.0)


@dataclass(frozen=True)
class SyncEntry:
    """A tensor's line of the plan: the method applied and every applicable method's option
    (``rows``: the tensor's :attr:`TensorInfo.rows`)."""

    name: str
    shape: tuple[int, ...]
    kind: str
    method: str
    seconds: float
    nbytes: int
    rows: float = 0.0
    options: dict[str, Option] = field(default_factory=dict)


@dataclass
class SyncPlan:
    """A plan as :func:`deepjimu.measure.sync.make_plan` made it: its entries and the figures
    it came from (the fitted links, the messages timed at their own sizes)."""

    entries: list[SyncEntry]
    links: dict[str, Any]
    measured: dict[str, float]


TRIAL_MARGIN = 0.02
"""The least a plan must beat DDP by in its trial (the median of the rounds' ratios)."""

TRIAL_MAJORITY = 0.75
"""The least share of a trial's rounds in which the plan must step faster than DDP."""


@dataclass(frozen=True)
class SyncTrial:
    """``--sync-plan auto``'s plan held to torch's DDP (the default), both stepped alternately
    in the same processes on the run's first batches: each round's step seconds of each (the
    slowest rank's). Predictions miss what DDP really does (its buckets overlap the backward
    pass) and one run's noise is 10-40% here; steps taken side by side see the same load,
    so each round gives one ratio of the two.

    Example:
        >>> SyncTrial(plan_s=(0.8,) * 7, ddp_s=(1.0,) * 7).keeps_plan
        True
        >>> SyncTrial(plan_s=(0.8, 1.2) * 4, ddp_s=(1.0,) * 8).keeps_plan
        False
    """

    plan_s: tuple[float, ...]
    ddp_s: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        """Each round's plan step over DDP's."""
        return [p / d for p, d in zip(self.plan_s, self.ddp_s, strict=True)]

    @property
    def ratio(self) -> float:
        """The median of the rounds' ratios."""
        return statistics.median(self.ratios)

    @property
    def spread(self) -> float:
        """How far the rounds' ratios scatter: their median absolute deviation."""
        middle = self.ratio
        return statistics.median(abs(r - middle) for r in self.ratios)

    @property
    def wins(self) -> int:
        """The rounds in which the plan's step was the faster."""
        return sum(r < 1 for r in self.ratios)

    @property
    def keeps_plan(self) -> bool:
        """Whether the plan replaces DDP: only where its median step is below DDP's by more
        than :data:`TRIAL_MARGIN` and it was the faster in at least :data:`TRIAL_MAJORITY`
        of the rounds, never fewer than the noise explains (a sign test: n/2 + sqrt(n) of n,
        two standard deviations past an even split; it decides below 16 rounds).

        The rule leans to the default on purpose: a plan that wins 60-70% of the rounds is
        a tie that the next run's load can turn (issue 47: the embedding's sparse rows
        kept so measured 0.88-0.92x DDP in their trials, then 1.28x in the benchmark's own
        interleaved steps), while the plans that gain win nearly every round (0.67-0.79x
        DDP, faster in all of them). Wrongly leaving DDP costs more than missing a tie.
        """
        n = len(self.ratios)
        needed = max(TRIAL_MAJORITY * n, n / 2 + math.sqrt(n))
        return self.ratio < 1 - TRIAL_MARGIN and self.wins >= needed

    def to_dict(self) -> dict[str, Any]:
        """The trial as ``sync_plan.json`` keeps it."""
        return {
            "plan_step_s": list(self.plan_s),
            "ddp_step_s": list(self.ddp_s),
            "ratio": self.ratio,
            "spread": self.spread,
            "plan_faster_rounds": self.wins,
            "kept": "plan" if self.keeps_plan else "DDP",
        }


def applicable(t: TensorInfo) -> tuple[str, ...]:
    """The methods that can synchronise ``t``: all-reduce and the sharded server always,
    sufficient factors for Linear weights, sparse rows for sparse embedding weights.

    Example:
        >>> applicable(TensorInfo("0.weight", (4, 3), "linear", rows=2))
        ('allreduce', 'ps', 'sfb')
    """
    extra = {"linear": ("sfb",), "embedding": ("sparse",)}.get(t.kind, ())
    return ("allreduce", "ps", *extra)


def method_messages(t: TensorInfo, method: str, p: int) -> list[tuple[str, int]]:
    """The collectives (name, bytes per rank) of ``method`` on ``t`` over ``p`` ranks in one step.

    Example:
        >>> method_messages(TensorInfo("w", (3, 5)), "ps", 2)
        [('reduce_scatter', 64), ('all_gather', 32)]

    Raises:
        ValueError: ``method`` does not apply to ``t``.
    """
    if method not in applicable(t):
        raise ValueError(f"{method} does not apply to {t.name} (a {t.kind} tensor)")
    n = t.numel
    if method == "allreduce":
        return [("all_reduce", _F32 * n)]
    if method == "ps":
        padded = math.ceil(n / p) * p
        return [("reduce_scatter", _F32 * padded), ("all_gather", _F32 * padded // p)]
    out_dim, in_dim = t.shape
    if method == "sfb":
        return [("all_gather", _F32 * math.ceil(t.rows) * (out_dim + in_dim))]
    k = math.ceil(t.rows)
    if t.native:  # the backend's own sparse all-reduce: counts, indices, values
        return [
            ("all_gather", COUNT_BYTES),
            ("all_gather", _INDEX * k),
            ("all_gather", _F32 * k * in_dim),
        ]
    return [("all_gather", COUNT_BYTES), ("all_gather", _F32 * k * (in_dim + 1))]


def _collective_s(
    cluster: Cluster, name: str, nbytes: int, p: int, measured: Mapping[str, float] | None
) -> float:
    if name == "reduce_scatter":
        # half a ring all-reduce: the probe's own fit when it timed one, else all-reduce's hop
        hop = name if name in cluster.collectives else "all_reduce"
        return cluster.reduce_scatter_s(nbytes, p, hop)
    return message_s(cluster, name, nbytes, p, measured)


def fused(t: TensorInfo) -> bool:
    """Whether an all-reduce of ``t`` goes in the fused message (the executor's rule,
    :func:`deepjimu.compress.payload.fuses`)."""
    return fuses(t.kind == "embedding", t.numel)


def price(
    t: TensorInfo,
    method: str,
    cluster: Cluster,
    p: int,
    measured: Mapping[str, float] | None = None,
    fused_bytes: int = 0,
) -> Option:
    """``method``'s predicted seconds on ``t``: its messages over the cluster, plus the
    rebuild of the sufficient factors for ``sfb``. A :func:`fused` tensor's all-reduce is
    its marginal cost in the one all-reduce of every fused tensor of the model
    (``fused_bytes``: their bytes): its bytes' share of that message's time beyond the
    latency, which is the option's :attr:`~Option.shared_s`, paid once per step.

    Raises:
        ValueError: ``method`` does not apply to ``t``.
    """
    msgs = method_messages(t, method, p)
    if method == "allreduce" and fused(t) and fused_bytes:
        whole = _collective_s(cluster, "all_reduce", fused_bytes, p, measured)
        latency = min(whole, _collective_s(cluster, "all_reduce", 0, p, None))
        seconds = (whole - latency) * (msgs[0][1] / fused_bytes)
        return Option(method, seconds, msgs[0][1], tuple(msgs), shared_s=latency)
    seconds = sum(_collective_s(cluster, c, b, p, measured) for c, b in msgs)
    if method == "sfb":
        seconds += t.rebuild_s
    return Option(method, seconds, sum(b for _, b in msgs), tuple(msgs))


def plan_sync(
    tensors: Sequence[TensorInfo],
    plan: str,
    cluster: Cluster,
    p: int,
    measured: Mapping[str, float] | None = None,
) -> list[SyncEntry]:
    """The method of every tensor under ``plan``.

    ``auto`` takes each tensor's fastest predicted method (a tie goes to the one earlier in
    :data:`METHODS`), with the fused all-reduce's latency decided for the plan: the cheaper
    of the plan that sends that message (each small tensor then all-reduced if its marginal
    cost is the least) and the plan that sends none of it. A single method applies wherever
    it can, and the tensors it cannot synchronise (``sfb``: all but Linear weights;
    ``sparse``: all but sparse embedding weights) are all-reduced. The first entry whose
    option has a shared cost carries it, so that the entries' seconds sum to the step's.

    Args:
        tensors: the model's parameters.
        plan: one of :data:`PLANS`.
        cluster: where the step runs (the probe's cluster on this machine).
        p: ranks taking part.
        measured: all-gathers timed at their own sizes (``"all_gather:bytes"`` -> seconds).

    Raises:
        JimuError: an unknown plan.

    Example:
        >>> from deepjimu.cost.cluster import Device, Link
        >>> c = Cluster("toy", 1, 2, Device("d", {"fp32": 1.0}, 0), Link(0.0, 1e9), None)
        >>> w = TensorInfo("fc.weight", (1000, 1000), "linear", rows=10)
        >>> [e.method for e in plan_sync([w], "auto", c, 2)]
        ['sfb']
    """
    if plan not in PLANS:
        raise JimuError(f"sync-plan must be one of {', '.join(PLANS)} (sync-plan: {plan!r})")
    small = sum(_F32 * t.numel for t in tensors if fused(t))
    priced = [{m: price(t, m, cluster, p, measured, small) for m in applicable(t)} for t in tensors]
    if plan == "auto":
        chosen = min((_fastest(priced, shared) for shared in (True, False)), key=total_s)
    else:
        chosen = [options.get(plan, options["allreduce"]) for options in priced]
    out, carried = [], False
    for t, options, best in zip(tensors, priced, chosen, strict=True):
        seconds = best.seconds + (best.shared_s if not carried else 0.0)
        carried = carried or best.shared_s > 0
        out.append(
            SyncEntry(t.name, t.shape, t.kind, best.method, seconds, best.nbytes, t.rows, options)
        )
    return out


def _fastest(priced: Sequence[Mapping[str, Option]], shared: bool) -> list[Option]:
    """Each tensor's fastest option, among those with a shared cost only if ``shared``
    (a tie goes to the method earlier in :data:`METHODS`)."""
    return [
        min(
            (o for o in options.values() if shared or not o.shared_s),
            key=lambda o: (o.seconds, METHODS.index(o.method)),
        )
        for options in priced
    ]


def plan_to_dict(entries: Sequence[SyncEntry], plan: str, p: int) -> dict[str, Any]:
    """The plan as JSON-able values (``sync_plan.json``): per tensor its method, seconds,
    bytes and every option; the totals per step; and each single method's totals applied
    to every tensor it can take (the rest all-reduced), for comparison."""
    whole = {}
    for method in METHODS:
        chosen = [e.options.get(method, e.options["allreduce"]) for e in entries]
        whole[method] = {
            "seconds": total_s(chosen),
            "bytes": sum(o.nbytes for o in chosen),
        }
    return {
        "plan": plan,
        "world": p,
        "seconds": sum(e.seconds for e in entries),
        "bytes": sum(e.nbytes for e in entries),
        "methods": {m: sum(e.method == m for e in entries) for m in METHODS},
        "single_methods": whole,
        "tensors": [
            {
                **{k: v for k, v in asdict(e).items() if k != "options"},
                "shape": list(e.shape),
                "options": {
                    m: {
                        "seconds": o.seconds,
                        "shared_seconds": o.shared_s,
                        "bytes": o.nbytes,
                        "messages": [list(x) for x in o.messages],
                    }
                    for m, o in e.options.items()
                },
            }
            for e in entries
        ],
    }


def format_plan(entries: Sequence[SyncEntry], plan: str) -> str:
    """The plan as a table: tensor, shape, method, predicted ms, bytes per step; then the totals."""
    width = max([len("tensor"), *(len(e.name) for e in entries)]) + 2
    lines = [f"{'tensor':<{width}}{'shape':<16}{'method':<11}{'pred. ms':>10}{'bytes':>12}"]
    for e in entries:
        shape = "x".join(map(str, e.shape))
        lines.append(
            f"{e.name:<{width}}{shape:<16}{e.method:<11}{e.seconds * 1e3:>10.3f}"
            f"{format_bytes(e.nbytes):>12}"
        )
    seconds = sum(e.seconds for e in entries)
    total_b = sum(e.nbytes for e in entries)
    counts = ", ".join(f"{m} {n}" for m in METHODS if (n := sum(e.method == m for e in entries)))
    fused_in = [e for e in entries if e.options[e.method].shared_s]
    if fused_in:
        first = fused_in[0]
        latency = first.options[first.method].shared_s
        lines.append(
            f"{len(fused_in)} small tensor{'s' if len(fused_in) > 1 else ''} in one all-reduce: "
            f"its latency, "
            f"{latency * 1e3:.3f} ms, counted once (on {first.name})"
        )
    lines.append(
        f"sync-plan {plan}: {counts}; predicted {seconds * 1e3:.3f} ms and "
        f"{format_bytes(total_b)} sent per step"
    )
    return "\n".join(lines)
