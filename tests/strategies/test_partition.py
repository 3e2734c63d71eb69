"""Tests of the stage planner: exact block partition, --balance parsing, profiling, StagePlan."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from torch import nn

from deepjimu.balance import parse_balance, partition
from deepjimu.errors import JimuError
from deepjimu.models import build_model
from deepjimu.strategies.partition import StagePlan, balance_by_size, block_shapes


def _brute_force(costs: list[float], k: int) -> float:
    """The smallest largest-part sum over every way to cut ``costs`` into k non-empty parts."""
    n, best = len(costs), math.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(edges)))
    return best


def test_partition_is_optimal_on_random_costs() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 8)
        k = rng.randint(1, n)
        costs = [rng.choice([0.0, rng.random(), float(rng.randint(1, 5))]) for _ in range(n)]
        sizes = partition(costs, k)
        assert len(sizes) == k and sum(sizes) == n and min(sizes) >= 1
        edges = [0, *itertools.accumulate(sizes)]
        worst = max(sum(costs[a:b]) for a, b in itertools.pairwise(edges))
        assert math.isclose(worst, _brute_force(costs, k), rel_tol=1e-9, abs_tol=1e-12), (
            costs,
            k,
            sizes,
        )


def test_partition_examples_and_errors() -> None:
    assert partition([1, 1, 1, 3], 2) == [3, 1]
    assert partition([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert partition([2, 2, 2, 2], 4) == [1, 1, 1, 1]
    assert partition([7.0], 1) == [1]
    with pytest.raises(JimuError, match="cannot cut 3 blocks into 4"):
        partition([1, 1, 1], 4)
    with pytest.raises(JimuError, match="cannot cut"):
        partition([1, 1], 0)
    with pytest.raises(JimuError, match="must be >= 0"):
        partition([1, -1], 2)


def test_parse_balance() -> None:
    assert parse_balance("3,1", 4, 2) == [3, 1]
    assert parse_balance(" 1, 1,2", 4, 3) == [1, 1, 2]
    cases = {
        ("2,1", 4, 2): "balance must sum to the number of blocks (blocks: 4, sum of balance: 3)",
        ("1,1,2", 4, 2): "balance must give one block count per stage (stages: 2, entries: 3)",
        ("4,0", 4, 2): "balance entries must be >= 1 (balance: 4,0)",
        (
            "fast",
            4,
            2,
        ): "balance must be auto, even, speed, time, size or block counts per stage like 2,2 (balance: 'fast')",
    }
    for args, message in cases.items():
        with pytest.raises(JimuError) as err:
            parse_balance(*args)
        assert str(err.value) == message


def test_stage_plan() -> None:
    plan = StagePlan((1, 2, 1), world=3, how="time")
    assert [plan.bounds(s) for s in range(3)] == [(0, 1), (1, 3), (3, 4)]
    assert plan.blocks_of(1) == [1, 2] and plan.rank_of(2) == 2
    assert plan.summary("pipeline") == "pipeline: 3 stages, blocks [1, 2, 1], balance by time"
    interleaved = StagePlan((1, 1, 1, 1), world=2, how="list")
    assert interleaved.stages_of(0) == [0, 2] and interleaved.blocks_of(1) == [1, 3]
    assert interleaved.summary("pipeline").startswith("pipeline: 4 stages on 2 ranks")
    one = StagePlan((4,), world=1, how="time")
    assert one.summary("model-parallel") == "model-parallel: 1 stage, blocks [4], balance by time"
    assert StagePlan((2, 2), world=1, how="list").summary("p").startswith("p: 2 stages on 1 rank,")


def test_block_shapes() -> None:
    model = build_model("mlp:16x2", (1, 8, 8), 10)
    shapes = block_shapes(model, torch.zeros(1, 1, 8, 8))
    assert [s for s, _ in shapes] == [(1, 8, 8), (16,), (16,), (10,)]
    assert model.training


def test_balance_by_size_isolates_the_big_block() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 400), nn.Linear(400, 4), nn.Linear(4, 4))
    assert balance_by_size(model, 2) == [2, 2]
    assert balance_by_size(model, 3) == [1, 1, 2]


def test_partition_over_speeds_and_cut_costs_is_optimal_on_random_costs() -> None:
    """The exact minimiser of the slowest part's time: costs over its rank's speed plus the
    cuts at its two ends, against every way to cut (brute force)."""
    rng = random.Random(7)
    for _ in range(150):
        n, k = rng.randint(2, 7), rng.randint(1, 4)
        if k > n:
            continue
        costs = [rng.uniform(0, 5) for _ in range(n)]
        speeds = [rng.uniform(0.1, 1) for _ in range(k)]
        cuts = [rng.uniform(0, 2) for _ in range(n - 1)]

        def slowest(
            sizes: list[int],
            costs: list[float] = costs,
            speeds: list[float] = speeds,
            cuts: list[float] = cuts,
            n: int = n,
        ) -> float:
            worst, at = 0.0, 0
            for j, size in enumerate(sizes):
                left = cuts[at - 1] if at > 0 else 0.0
                right = cuts[at + size - 1] if at + size < n else 0.0
                worst = max(worst, sum(costs[at : at + size]) / speeds[j] + left + right)
                at += size
            return worst

        sizes = partition(costs, k, speeds, cuts)
        assert sum(sizes) == n and len(sizes) == k and min(sizes) >= 1
        best = min(
            slowest([b - a for a, b in zip((0, *ends), (*ends, n), strict=True)])
            for ends in itertools.combinations(range(1, n), k - 1)
        )
        assert slowest(sizes) == pytest.approx(best)


def test_a_slower_rank_gets_fewer_blocks_and_bad_speeds_are_refused() -> None:
    assert partition([1.0] * 8, 2) == [4, 4]
    assert partition([1.0] * 8, 2, speeds=[1.0, 0.3]) == [6, 2]
    assert partition([1.0] * 8, 2, speeds=[0.3, 1.0]) == [2, 6]
    # a costly cut is avoided (ties: the latest cut)
    assert partition([1.0] * 4, 2, cut_costs=[0.0, 5.0, 0.0]) == [3, 1]
    with pytest.raises(JimuError, match=r"need 2 speeds > 0 \(speeds: \[1.0, 0.0\]\)"):
        partition([1.0] * 4, 2, speeds=[1.0, 0.0])
    with pytest.raises(JimuError, match="need 3 cut costs >= 0"):
        partition([1.0] * 4, 2, cut_costs=[1.0])
