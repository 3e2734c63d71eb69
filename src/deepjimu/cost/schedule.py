"""Pipeline schedules as data, and an event-driven replay of one training step through a cost model.

A pipeline step runs m micro-batches through S stages: stage s of micro-batch i is a forward
F(s, i) and a backward B(s, i). :func:`actions` lists, per rank, the order in which the
``pipeline`` strategy's torch schedules (GPipe, 1F1B, interleaved 1F1B) run them;
:func:`simulate` replays those orders with a time per action and per transfer. A rank runs
its actions one at a time, in order; an action waits for its inputs (the previous stage's
forward, the next stage's backward), which travel asynchronously, first come first served on
each directed link between two ranks. The step time is then what the order and the costs
make it, bubbles included, rather than a closed formula that holds only for equal stages.

torch also waits for some of its own sends (1F1B fuses a send with the next receive); the
replay does not, which matters only when a transfer takes longer than the compute beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["SCHEDULES", "Action", "Simulation", "Span", "actions", "simulate", "stage_ranks"]

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class Action:
    """One compute action: the forward ``"F"`` or backward ``"B"`` of a stage on a micro-batch.

    ``str()`` is torch's notation (stage, kind, micro-batch), as in its schedule dumps.

    Example:
        >>> str(Action("B", 2, 0))
        '2B0'
    """

    kind: Literal["F", "B"]
    stage: int
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in ("F", "B") or self.stage < 0 or self.microbatch < 0:
            raise ValueError(
                f"an action is F or B of a stage >= 0 on a micro-batch >= 0 "
                f"(kind: {self.kind!r}, stage: {self.stage}, microbatch: {self.microbatch})"
            )

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


def stage_ranks(world: int, chunks: int = 1) -> list[int]:
    """The rank that holds each of the S = world * chunks stages: rank r holds r, r + world, ...

    Args:
        world: pipeline ranks.
        chunks: stages per rank (2 for the interleaved schedule).

    Returns:
        ``stage_rank[s]``, the rank owning stage s.

    Example:
        >>> stage_ranks(2, chunks=2)
        [0, 1, 0, 1]
    """
    return [s % world for s in range(world * chunks)]


def actions(schedule: str, world: int, microbatches: int, chunks: int = 1) -> list[list[Action]]:
    """Each rank's compute actions, in the order torch's schedule runs them.

    Written here rather than read from torch: torch builds the orders only inside a
    schedule object made from stages (GPipe and 1F1B run theirs from ``_step_microbatches``,
    the interleaved one from ``ScheduleInterleaved1F1B.pipeline_order``), its
    ``pipeline_order`` for 1F1B is off by one on the last rank (it is a drawing, not what
    runs), and the planner stays importable without torch. tests/plan/test_schedule.py checks
    that these orders equal the ones torch executes.

    Args:
        schedule: ``"gpipe"`` (all forwards, then all backwards), ``"1f1b"`` (warm-up
            forwards, then one forward one backward) or ``"interleaved"`` (1F1B over
            ``chunks`` stages per rank, rank r holding stages r, r + world, ...).
        world: pipeline ranks.
        microbatches: m, micro-batches per step.
        chunks: stages per rank; 1 except for ``"interleaved"``.

    Returns:
        ``orders[rank]``, that rank's actions; stages are numbered as :func:`stage_ranks`.

    Raises:
        ValueError: an unknown schedule, or sizes the torch schedule refuses.

    Example:
        >>> [str(a) for a in actions("1f1b", 2, 3)[0]]
        ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    """
    m, v = microbatches, chunks
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)} (schedule: {schedule!r})")
    if world < 1 or m < 1 or v < 1:
        raise ValueError(
            f"world, microbatches and chunks must be >= 1 "
            f"(world: {world}, microbatches: {m}, chunks: {v})"
        )
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"schedule {schedule} holds one stage per rank (chunks: {v})")
    if schedule == "1f1b" and m < world:
        raise ValueError(
            f"schedule 1f1b needs microbatches >= stages (microbatches: {m}, stages: {world})"
        )
    # torch's interleaved schedule runs micro-batches in rounds of m // rounds per stage
    rounds = max(1, m // world)
    if schedule == "interleaved" and m % rounds:
        raise ValueError(
            f"schedule interleaved needs microbatches to be a multiple of microbatches // world "
            f"(microbatches: {m}, world: {world})"
        )

    orders = []
    for rank in range(world):
        if schedule == "interleaved":
            per_round = m // rounds
            forwards = [
                Action("F", s, i) for s, i in _depth_first(rank, world, v, m, per_round, False)
            ]
            backwards = [
                Action("B", s, i) for s, i in _depth_first(rank, world, v, m, per_round, True)
            ]
            # The last rank warms up the later chunks' first round; each hop back waits for
            # two more actions (the forward there and the backward back) before its first B.
            warmup = min((v - 1) * per_round + 2 * (world - 1 - rank), m * v)
        else:
            forwards = [Action("F", rank, i) for i in range(m)]
            backwards = [Action("B", rank, i) for i in range(m)]
            # 1F1B: the first backward reaches rank r after the world - r - 1 forwards still
            # in flight downstream (torch counts world - r with the first B in front; same order)
            warmup = m if schedule == "gpipe" else world - rank - 1
        orders.append(_one_forward_one_backward(forwards, backwards, warmup))
    return orders


def _depth_first(
    rank: int, world: int, v: int, m: int, per_round: int, backward: bool
) -> list[tuple[int, int]]:
    """(stage, micro-batch) pairs of one rank: a round of micro-batches on each of its chunks
    in turn, first chunk first for forwards, last chunk first for backwards."""
    pairs = []
    for k in range(m * v):
        chunk = (k // per_round) % v
        if backward:
            chunk = v - 1 - chunk
        pairs.append((chunk * world + rank, (k // (per_round * v)) * per_round + k % per_round))
    return pairs


def _one_forward_one_backward(
    forwards: list[Action], backwards: list[Action], warmup: int
) -> list[Action]:
    """``warmup`` forwards, then alternately one forward and one backward, then the rest."""
    steady = len(forwards) - warmup
    order = forwards[:warmup]
    for f, b in zip(forwards[warmup:], backwards[:steady], strict=True):
        order += [f, b]
    return order + backwards[steady:]


@dataclass(frozen=True)
class Span:
    """When one action ran on its rank, in seconds from the start of the step."""

    action: Action
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Simulation:
    """One replayed step: its length, each rank's compute time and every action's span.

    Example:
        >>> sim = Simulation(makespan_s=4.0, busy_s=(3.0, 3.0), spans=((), ()))
        >>> sim.bubble_fraction
        0.25
    """

    makespan_s: float
    busy_s: tuple[float, ...]
    spans: tuple[tuple[Span, ...], ...]  # per rank, in the order the rank ran them

    @property
    def bubble_fraction(self) -> float:
        """Share of rank time spent idle: 1 - sum(busy_s) / (world * makespan_s)."""
        if self.makespan_s == 0:
            return 0.0
        return 1 - sum(self.busy_s) / (len(self.busy_s) * self.makespan_s)


def simulate(
    orders: Sequence[Sequence[Action]],
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    send_s: Callable[[int, int], float],
    stage_rank: Sequence[int],
) -> Simulation:
    """Replay each rank's order with the given costs; every rank starts at time 0.

    F(s, i) waits for F(s - 1, i) and its transfer; B(s, i) waits for F(s, i) and, below the
    last stage, for B(s + 1, i) and its transfer. A transfer starts when its action ends and
    the directed link (rank, rank') has finished the transfers queued before it; it takes no
    compute on either rank. Between stages of the same rank nothing moves and ``send_s`` is
    not called.

    Args:
        orders: ``orders[rank]``, the actions that rank runs, in order (see :func:`actions`).
        forward_s: seconds of one micro-batch's forward on each stage.
        backward_s: seconds of one micro-batch's backward on each stage.
        send_s: ``send_s(stage_from, stage_to)``, seconds to move one micro-batch's
            activation (to stage + 1) or gradient (to stage - 1) between two ranks.
        stage_rank: the rank owning each stage (see :func:`stage_ranks`).

    Returns:
        The :class:`Simulation` of the step.

    Raises:
        ValueError: lengths or ranks that disagree, a negative time, an action listed twice
            or on a rank that does not hold its stage, or orders that deadlock.

    Example:
        >>> sim = simulate(actions("gpipe", 2, 4), [1, 1], [2, 2], lambda a, b: 0.0, [0, 1])
        >>> sim.makespan_s, round(sim.bubble_fraction, 2)
        (15.0, 0.2)
    """
    S, world = len(stage_rank), len(orders)
    _check_replay(orders, forward_s, backward_s, stage_rank)

    end: dict[Action, float] = {}
    arrive: dict[Action, float] = {}  # when an action's output reaches the rank that needs it
    link_free: dict[tuple[int, int], float] = {}
    clock, busy = [0.0] * world, [0.0] * world
    spans: list[list[Span]] = [[] for _ in range(world)]
    done = [0] * world
    progressed = True
    # Any rank that can move does; the result does not depend on which moves first, since a
    # link only carries one rank's sends, queued in that rank's own order.
    while progressed:
        progressed = False
        for rank in range(world):
            while done[rank] < len(orders[rank]):
                a = orders[rank][done[rank]]
                ready = _ready_at(a, S, end, arrive)
                if ready is None:
                    break
                start = max(clock[rank], ready)
                cost = (forward_s if a.kind == "F" else backward_s)[a.stage]
                clock[rank] = end[a] = start + cost
                busy[rank] += cost
                spans[rank].append(Span(a, start, end[a]))
                arrive[a] = _handoff(a, rank, end[a], S, stage_rank, send_s, link_free)
                done[rank] += 1
                progressed = True

    stuck = [
        f"rank {rank} at {orders[rank][done[rank]]}"
        for rank in range(world)
        if done[rank] < len(orders[rank])
    ]
    if stuck:
        raise ValueError(
            f"orders deadlock: an action waits for one that never runs ({', '.join(stuck)})"
        )
    return Simulation(
        makespan_s=max(clock, default=0.0),
        busy_s=tuple(busy),
        spans=tuple(tuple(s) for s in spans),
    )


def _check_replay(
    orders: Sequence[Sequence[Action]],
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    stage_rank: Sequence[int],
) -> None:
    """Refuse inputs that :func:`simulate` cannot replay (see its Raises), before it starts."""
    S, world = len(stage_rank), len(orders)
    if len(forward_s) != S or len(backward_s) != S:
        raise ValueError(
            f"forward_s and backward_s need one time per stage "
            f"(stages: {S}, forward_s: {len(forward_s)}, backward_s: {len(backward_s)})"
        )
    if any(not 0 <= r < world for r in stage_rank):
        raise ValueError(
            f"stage_rank must name ranks of orders (ranks: {world}, stage_rank: {list(stage_rank)})"
        )
    if any(t < 0 for t in (*forward_s, *backward_s)):
        raise ValueError(
            f"times must be >= 0 (forward_s: {list(forward_s)}, backward_s: {list(backward_s)})"
        )
    seen: set[Action] = set()
    for rank, order in enumerate(orders):
        for a in order:
            if a.stage >= S or stage_rank[a.stage] != rank:
                raise ValueError(
                    f"action {a} is on rank {rank}, which does not hold stage {a.stage} (stage_rank: {list(stage_rank)})"
                )
            if a in seen:
                raise ValueError(f"action {a} appears more than once in orders")
            seen.add(a)


def _ready_at(
    a: Action, S: int, end: dict[Action, float], arrive: dict[Action, float]
) -> float | None:
    """When ``a``'s inputs are all on its rank, or None while one has not run yet."""
    s, i = a.stage, a.microbatch
    waits: list[float | None] = []
    if a.kind == "F":
        if s > 0:
            waits.append(arrive.get(Action("F", s - 1, i)))
    else:
        waits.append(end.get(Action("F", s, i)))  # same stage, same rank: no transfer
        if s < S - 1:
            waits.append(arrive.get(Action("B", s + 1, i)))
    if any(w is None for w in waits):
        return None
    return max((w for w in waits if w is not None), default=0.0)


def _handoff(
    a: Action,
    rank: int,
    end_s: float,
    S: int,
    stage_rank: Sequence[int],
    send_s: Callable[[int, int], float],
    link_free: dict[tuple[int, int], float],
) -> float:
    """When ``a``'s output reaches the stage that consumes it; queues it on its link."""
    to = a.stage + 1 if a.kind == "F" else a.stage - 1
    if not 0 <= to < S or stage_rank[to] == rank:
        return end_s
    t = send_s(a.stage, to)
    if t < 0:
        raise ValueError(f"send_s must be >= 0 (send_s({a.stage}, {to}): {t})")
    link = (rank, stage_rank[to])
    link_free[link] = max(end_s, link_free.get(link, 0.0)) + t
    return link_free[link]
