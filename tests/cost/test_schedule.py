"""Tests of ``plan.schedule``: torch's orders as data, and replayed step times worked out by hand."""

from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from deepjimu.cost.schedule import Action, Simulation, actions, simulate, stage_ranks
from deepjimu.strategies.model_parallel import bubble_fraction


def _free(a: int, b: int) -> float:
    return 0.0


def _spans(sim: Simulation) -> dict[str, tuple[float, float]]:
    """Rank-free lookup: "0B3" -> (start, end)."""
    return {str(sp.action): (sp.start_s, sp.end_s) for rank in sim.spans for sp in rank}


def _orders(*ranks: str) -> list[list[Action]]:
    """Orders from torch's notation, one string per rank: "0F0 0B0"."""
    return [[_action(word) for word in rank.split()] for rank in ranks]


def _action(word: str) -> Action:
    stage, kind, microbatch = re.fullmatch(r"(\d+)([FB])(\d+)", word).groups()  # type: ignore[union-attr]
    return Action("F" if kind == "F" else "B", int(stage), int(microbatch))


# ---- orders --------------------------------------------------------------------------------


def test_orders_as_torch_documents_them() -> None:
    assert actions("gpipe", 2, 2) == _orders("0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1")
    # rank r warms up with world - r forwards before its first backward
    assert actions("1f1b", 3, 4) == _orders(
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
    )
    # rank r holds stages r and r + 2; micro-batches go in rounds of 2 over both
    assert actions("interleaved", 2, 4, chunks=2) == _orders(
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    )


@pytest.mark.parametrize(
    ("schedule", "world", "m", "chunks"),
    [
        ("gpipe", 1, 3, 1),
        ("gpipe", 3, 2, 1),
        ("1f1b", 4, 6, 1),
        ("interleaved", 2, 3, 2),
        ("interleaved", 3, 6, 2),
        ("interleaved", 4, 8, 3),
    ],
)
def test_every_action_once_on_the_rank_holding_its_stage(
    schedule: str, world: int, m: int, chunks: int
) -> None:
    orders = actions(schedule, world, m, chunks)
    owner = stage_ranks(world, chunks)
    S = world * chunks
    listed = Counter(a for order in orders for a in order)
    assert listed == Counter(
        Action(kind, s, i) for kind in ("F", "B") for s in range(S) for i in range(m)
    )
    assert all(owner[a.stage] == rank for rank, order in enumerate(orders) for a in order)


class _RecordingStage:
    """Stands in for a torch pipeline stage: no tensors, no peers, only the compute order."""

    def __init__(self, stage_index: int, num_stages: int, log: list[str]) -> None:
        self.stage_index, self.num_stages = stage_index, num_stages
        self.is_last = stage_index == num_stages - 1
        self.log = log

    def forward_one_chunk(self, i: int, *args: Any, **kwargs: Any) -> None:
        self.log.append(f"{self.stage_index}F{i}")

    def backward_one_chunk(self, i: int, **kwargs: Any) -> None:
        self.log.append(f"{self.stage_index}B{i}")

    def get_fwd_recv_ops(self, i: int) -> list[Any]:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def perform_reduce_grad(self, n: int) -> None:
        pass


@pytest.mark.parametrize(("schedule", "world", "m"), [("gpipe", 3, 2), ("1f1b", 3, 5)])
def test_single_stage_orders_equal_what_torch_runs(schedule: str, world: int, m: int) -> None:
    # torch's `pipeline_order` for these is a drawing (off by one on 1F1B's last rank): run
    # `_step_microbatches` itself with recording stages instead
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    ours = actions(schedule, world, m)
    for rank in range(world):
        log: list[str] = []
        torch_schedule = kind(_RecordingStage(rank, world, log), m, scale_grads=False)  # type: ignore[arg-type]
        torch_schedule._initialize_stage = lambda *args, **kwargs: None  # type: ignore[method-assign]
        torch_schedule._step_microbatches()
        assert [str(a) for a in ours[rank]] == log


@pytest.mark.parametrize(("world", "m", "chunks"), [(2, 4, 2), (2, 3, 2), (3, 6, 2), (4, 8, 3)])
def test_interleaved_order_equals_what_torch_runs(world: int, m: int, chunks: int) -> None:
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    # the constructor computes every rank's order; its stages only lend their sizes
    stages = [
        SimpleNamespace(num_stages=world * chunks, group_size=world, group_rank=0, stage_index=s)
        for s in range(0, world * chunks, world)
    ]
    torch_schedule = ScheduleInterleaved1F1B(stages, m, scale_grads=False)  # type: ignore[arg-type]
    ours = actions("interleaved", world, m, chunks)
    for rank in range(world):
        runs = [
            str(a)
            for a in torch_schedule.pipeline_order_with_comms[rank]
            if a.computation_type.value in ("F", "B")
        ]
        assert [str(a) for a in ours[rank]] == runs


@pytest.mark.parametrize(
    ("schedule", "world", "m", "chunks", "message"),
    [
        ("zigzag", 2, 4, 1, "schedule must be one of"),
        ("gpipe", 0, 4, 1, "must be >= 1"),
        ("gpipe", 2, 4, 2, "one stage per rank"),
        ("1f1b", 4, 3, 1, "microbatches >= stages"),
        ("interleaved", 2, 5, 2, "multiple of"),
    ],
)
def test_sizes_torch_refuses(schedule: str, world: int, m: int, chunks: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        actions(schedule, world, m, chunks)


# ---- replay --------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stages_fill_and_drain(schedule: str) -> None:
    # m = 4, S = 2, F = 1, B = 2: (m + S - 1)(F + B) = 15. GPipe: rank 1 runs F0..F3 in
    # [1, 5], B0..B3 in [5, 13]; rank 0's last B waits for rank 1's and ends at 15.
    sim = simulate(actions(schedule, 2, 4), [1, 1], [2, 2], _free, [0, 1])
    assert sim.makespan_s == 15
    assert sim.busy_s == (12, 12)
    assert sim.bubble_fraction == pytest.approx(1 - 24 / 30)
    assert _spans(sim)["1B3"] == (11, 13)
    assert _spans(sim)["0B3"] == (13, 15)


def test_gpipe_transfers_add_a_hop_each_way() -> None:
    # each F reaches rank 1 0.5 s later: rank 1 runs F0 at 1.5 and then back to back, B3 ends at
    # 13.5; gradients reach rank 0 at 8, 10, 12, 14, so its B3 ends at 16
    sim = simulate(actions("gpipe", 2, 4), [1, 1], [2, 2], lambda a, b: 0.5, [0, 1])
    assert sim.makespan_s == 16
    assert _spans(sim)["1F0"] == (1.5, 2.5)
    assert _spans(sim)["0B0"] == (8, 10)


def test_1f1b_transfers() -> None:
    # rank 0: F0 [0,1] F1 [1,2] B0 [5,7] F2 [7,8] B1 [8,10] F3 [10,11] B2 [12,14] B3 [15,17]
    # rank 1: F0 [1.5,2.5] B0 [2.5,4.5] F1 [4.5,5.5] B1 [5.5,7.5] F2 [8.5,9.5] B2 [9.5,11.5]
    #         F3 [11.5,12.5] B3 [12.5,14.5]; its gradient reaches rank 0 at 15
    sim = simulate(actions("1f1b", 2, 4), [1, 1], [2, 2], lambda a, b: 0.5, [0, 1])
    assert sim.makespan_s == 17
    assert _spans(sim)["1F2"] == (8.5, 9.5)
    assert _spans(sim)["0B2"] == (12, 14)


def test_transfers_queue_on_their_link() -> None:
    # F = B = 1, 3 s per transfer: F1's activation waits for F0's to clear the link 0 -> 1
    # (arrives at 7, not 5), and B1's gradient for B0's (arrives at 15, not 13)
    sim = simulate(actions("gpipe", 2, 2), [1, 1], [1, 1], lambda a, b: 3.0, [0, 1])
    assert _spans(sim)["1F1"] == (7, 8)
    assert _spans(sim)["0B1"] == (15, 16)
    assert sim.makespan_s == 16


def test_no_transfer_between_stages_of_one_rank() -> None:
    def send_s(a: int, b: int) -> float:
        raise AssertionError(f"send_s({a}, {b}) called for stages on one rank")

    sim = simulate(actions("interleaved", 1, 2, chunks=2), [1, 1], [2, 2], send_s, [0, 0])
    assert sim.makespan_s == 12
    assert sim.bubble_fraction == 0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_slowest_stage_sets_the_pace(schedule: str) -> None:
    # stage 1 takes F = 2, B = 4, stage 0 F = 1, B = 2: rank 1 is never idle after its first
    # input (at 1) and rank 0's last B follows it: F0 + m (F1 + B1) + B0 = 1 + 4 * 6 + 2
    sim = simulate(actions(schedule, 2, 4), [1, 2], [2, 4], _free, [0, 1])
    assert sim.makespan_s == 27
    assert sim.busy_s == (12, 24)


def test_interleaved_two_ranks_two_chunks() -> None:
    # F = 1, B = 2 per stage, no transfer. Worked by hand from the orders above:
    # rank 1: 1F0 [1,2] 1F1 [2,3] 3F0 [3,4] 3B0 [4,6] 3F1 [6,7] 3B1 [7,9] 1F2 [9,10]
    #         1B0 [10,12] 1F3 [12,13] 1B1 [13,15] 3F2 [15,16] 3B2 [16,18] 3F3 [18,19]
    #         3B3 [19,21] 1B2 [21,23] 1B3 [23,25]
    # rank 0: ... 2B2 [18,20] 2B3 [21,23] 0B2 [23,25] 0B3 [25,27]
    sim = simulate(actions("interleaved", 2, 4, chunks=2), [1] * 4, [2] * 4, _free, [0, 1, 0, 1])
    assert sim.makespan_s == 27
    assert sim.busy_s == (24, 24)
    assert _spans(sim)["1B3"] == (23, 25)
    assert _spans(sim)["0B0"] == (12, 14)
    # GPipe over the same model, two stages of F = 2, B = 4: (4 + 1) * 6 = 30
    assert simulate(actions("gpipe", 2, 4), [2, 2], [4, 4], _free, [0, 1]).makespan_s == 30


@pytest.mark.parametrize(
    ("schedule", "world", "m", "chunks"),
    [
        ("gpipe", 2, 4, 1),
        ("gpipe", 4, 4, 1),
        ("gpipe", 3, 7, 1),
        ("1f1b", 4, 8, 1),
        ("interleaved", 2, 4, 2),
        ("interleaved", 4, 8, 2),
        ("interleaved", 4, 8, 3),
    ],
)
def test_equal_stages_bubble_equals_the_formula(
    schedule: str, world: int, m: int, chunks: int
) -> None:
    # equal stages, no transfer: the idle share is (n - 1) / (v m + n - 1), as the pipeline
    # strategy reports it
    S = world * chunks
    sim = simulate(
        actions(schedule, world, m, chunks), [1] * S, [2] * S, _free, stage_ranks(world, chunks)
    )
    assert sim.bubble_fraction == pytest.approx(bubble_fraction(world, m, chunks))


# ---- bad orders ----------------------------------------------------------------------------


def test_orders_that_deadlock() -> None:
    # rank 1 waits for 0F1, which rank 0 runs only after 0B0, which waits for rank 1's 1B0
    crossed = _orders("0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1")
    with pytest.raises(ValueError, match=r"deadlock.*rank 0 at 0B0, rank 1 at 1F1"):
        simulate(crossed, [1, 1], [1, 1], _free, [0, 1])
    # a backward before its own forward
    with pytest.raises(ValueError, match="deadlock"):
        simulate(_orders("0B0 0F0"), [1], [1], _free, [0])
    # a gradient that never comes: 1B0 is missing
    with pytest.raises(ValueError, match=r"rank 0 at 0B0"):
        simulate(_orders("0F0 0B0", "1F0"), [1, 1], [1, 1], _free, [0, 1])


@pytest.mark.parametrize(
    ("orders", "forward_s", "stage_rank", "message"),
    [
        (_orders("0F0", "1F0"), [1], [0, 1], "one time per stage"),
        (_orders("0F0", "1F0"), [1, 1], [0, 2], "must name ranks"),
        (_orders("1F0", "0F0"), [1, 1], [0, 1], "does not hold stage"),
        (_orders("0F0 0F0", "1F0"), [1, 1], [0, 1], "more than once"),
        (_orders("0F0", "1F0"), [1, -1], [0, 1], ">= 0"),
    ],
)
def test_inconsistent_inputs(
    orders: list[list[Action]], forward_s: list[float], stage_rank: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        simulate(orders, forward_s, [1] * len(forward_s), _free, stage_rank)


def test_bad_action() -> None:
    with pytest.raises(ValueError, match="kind: 'W'"):
        Action("W", 0, 0)  # type: ignore[arg-type]
