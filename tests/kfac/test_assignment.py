"""The KAISA work assignment: greedy balance, gradient-worker and receiver groups for each F."""

from __future__ import annotations

import itertools

import pytest

from deepjimu.kfac.assignment import WorkAssignment, decomposition_cost


def test_greedy_puts_the_costliest_layers_first_on_the_least_loaded_rank() -> None:
    costs = [1.0, 8.0, 4.0, 4.0, 3.0]
    a = WorkAssignment.greedy(costs, world=2, grad_workers=2)
    # 8 -> rank 0; 4 -> rank 1; 4 -> rank 1 (4 < 8); 3 -> rank 0 (8 = 8, lower rank); 1 -> rank 1
    assert a.inv_workers == (1, 0, 1, 1, 0)
    assert a.loads(costs) == [11.0, 9.0]


@pytest.mark.parametrize("world", [2, 3])
def test_greedy_is_within_the_lpt_bound_of_the_best_split(world: int) -> None:
    costs = [
        decomposition_cost(n_a, n_g)
        for n_a, n_g in [(65, 256), (257, 256), (257, 256), (257, 10), (26, 6), (151, 16)]
    ]
    a = WorkAssignment.greedy(costs, world=world, grad_workers=world)
    best = min(
        max(sum(c for c, r in zip(costs, owner, strict=True) if r == k) for k in range(world))
        for owner in itertools.product(range(world), repeat=len(costs))
    )
    # Graham's bound for longest-processing-time-first scheduling
    assert max(a.loads(costs)) <= (4 / 3 - 1 / (3 * world)) * best + 1e-9


@pytest.mark.parametrize(
    ("world", "grad_workers"), [(4, 1), (4, 2), (4, 4), (6, 2), (6, 3), (1, 1)]
)
def test_every_receiver_group_holds_one_gradient_worker_of_every_layer(
    world: int, grad_workers: int
) -> None:
    a = WorkAssignment.greedy([5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 1.0], world, grad_workers)
    columns, rows = a.worker_groups(), a.receiver_groups()
    assert sorted(r for g in columns for r in g) == list(range(world))
    assert sorted(r for g in rows for r in g) == list(range(world))
    assert all(len(g) == grad_workers for g in columns)
    assert all(len(g) == world // grad_workers for g in rows)
    for layer, inv in enumerate(a.inv_workers):
        workers = a.grad_workers_of(layer)
        assert inv in workers
        assert [r for r in range(world) if a.is_grad_worker(layer, r)] == list(workers)
        for row in rows:
            (src,) = [r for r in row if r in workers]
            assert all(a.grad_source(layer, r) == src for r in row)


def test_comm_opt_and_mem_opt_are_the_two_ends() -> None:
    comm_opt = WorkAssignment.greedy([3.0, 2.0, 1.0], world=3, grad_workers=3)
    assert comm_opt.worker_groups() == [(0, 1, 2)]  # decompositions go to everyone
    assert comm_opt.receiver_groups() == [(0,), (1,), (2,)]  # no gradient broadcast
    mem_opt = WorkAssignment.greedy([3.0, 2.0, 1.0], world=3, grad_workers=1)
    assert mem_opt.worker_groups() == [(0,), (1,), (2,)]  # no decomposition broadcast
    assert mem_opt.receiver_groups() == [(0, 1, 2)]  # gradients go to everyone
    assert mem_opt.inv_workers == (0, 1, 2)


@pytest.mark.parametrize(("world", "grad_workers"), [(3, 2), (4, 0), (2, 3)])
def test_grad_workers_must_divide_the_world(world: int, grad_workers: int) -> None:
    with pytest.raises(ValueError, match="grad_workers must divide world"):
        WorkAssignment.greedy([1.0], world, grad_workers)


def test_with_speeds_a_slow_rank_decomposes_less() -> None:
    costs = [4.0] * 6
    even = WorkAssignment.greedy(costs, 2, 2)
    assert even.loads(costs) == [12.0, 12.0]
    slow = WorkAssignment.greedy(costs, 2, 2, speeds=[1.0, 0.25])
    fast, slow_load = slow.loads(costs)
    assert slow_load < fast  # rank 1 at a quarter of the speed takes fewer layers
    # the slowest rank's time is no more than with the even split
    speeds = [1.0, 0.25]
    even_time = max(load / v for load, v in zip(even.loads(costs), speeds, strict=True))
    assert max(fast / 1.0, slow_load / 0.25) <= even_time
    with pytest.raises(ValueError, match="need 2 speeds > 0"):
        WorkAssignment.greedy(costs, 2, 2, speeds=[1.0])
