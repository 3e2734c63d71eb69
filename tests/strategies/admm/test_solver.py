"""Solver, the engine both the strategy and PdADMM drive: its order of work, its rho
schedule and its state, against the block's own phases driven by hand."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from deepjimu.bookkeeping import Bookkeeping
from deepjimu.comm import Comm, CommStats
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import Exchange, serial_iteration
from deepjimu.strategies.admm.solver import Solver


def _block(momentum: float = 0.5) -> LayerBlock:
    g = torch.Generator().manual_seed(0)
    widths = (6, 8, 3)
    W = [torch.randn(b, a, generator=g) * 0.5 for a, b in itertools.pairwise(widths)]
    b = [torch.zeros(w.shape[0]) for w in W]
    return LayerBlock(0, 2, 2, W, b, AdmmParams(rho=0.5, nu=1.0, momentum=momentum, ridge=0.01))


def _solver(block: LayerBlock, sweeps: int = 1, rho_growth: float = 1.0) -> Solver:
    ex = Exchange(Comm(CommStats()), 0, torch.device("cpu"))
    return Solver(block, ex, 0, 1, Bookkeeping(1), sweeps=sweeps, rho_growth=rho_growth)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g)


def test_the_sweeps_after_a_start_run_before_the_next_iteration() -> None:
    """start, iterate, iterate = forward start, the sweeps, then iterations with momentum."""
    x, y = _data()
    ref, block = _block(), _block()
    ref.init_forward(x)
    for _ in range(2):
        ref.sweep_backward(y)
    for _ in range(2):
        serial_iteration(ref, y)
        ref.extrapolate()
    solver = _solver(block, sweeps=2)
    solver.start(x, len(x))
    solver.iterate(y)
    solver.iterate(y)
    assert solver.iterations == 2
    for l in range(2):
        assert torch.equal(block.W[l], ref.W[l]) and torch.equal(block.z[l], ref.z[l])


def test_rho_grows_exactly_when_the_residual_stalls_over_ten_checks() -> None:
    solver = _solver(_block(), rho_growth=3.0)
    falling = [10.0 * 0.9**k for k in range(15)]  # falls 10% per check: never grows
    assert not any(solver.schedule(r) for r in falling)
    assert solver.block.params.rho == 0.5
    solver.history.clear()
    flat = [1.0] * 10 + [0.995]  # the 11th check is within 1% of the best of the 10 before
    grew = [solver.schedule(r) for r in flat]
    assert grew == [False] * 10 + [True] and solver.block.params.rho == 1.5
    assert solver.history == []  # a new window after each growth
    off = _solver(_block())  # rho_growth 1: never, and nothing recorded
    assert not any(off.schedule(1.0) for _ in range(20)) and off.history == []


def test_state_dict_resumes_the_iterate_the_schedule_and_the_count() -> None:
    x, y = _data()
    whole = _solver(_block(), rho_growth=2.0)
    whole.start(x, len(x))
    for _ in range(4):
        whole.iterate(y)
        whole.schedule(whole.objective_and_residual(y)[1])
    half = _solver(_block(), rho_growth=2.0)
    half.start(x, len(x))
    for _ in range(2):
        half.iterate(y)
        half.schedule(half.objective_and_residual(y)[1])
    resumed = _solver(_block(momentum=0.5), rho_growth=2.0)
    resumed.load_state_dict(copy.deepcopy(half.state_dict()), torch.device("cpu"))
    assert resumed.history == half.history and resumed.iterations == 2
    for _ in range(2):
        resumed.iterate(y)
        resumed.schedule(resumed.objective_and_residual(y)[1])
    assert resumed.iterations == 4
    assert resumed.objective_and_residual(y) == whole.objective_and_residual(y)


def test_a_measured_iteration_reports_its_own_iterate_without_a_second_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """iterate(measure=True): the objective and residual of the iterate the updates made,
    before momentum, equal to computing them there afresh; its (W, b, z) steps kept each
    layer's terms of a = p W^T + b, so reporting multiplies nothing again."""
    x, y = _data()
    ref, block = _block(momentum=0.7), _block(momentum=0.7)
    ref.init_forward(x)
    ref.sweep_backward(y)
    solver = _solver(block)
    solver.start(x, len(x))
    for measure in (False, True, False, True):
        serial_iteration(ref, y)
        want = ref.objective_and_residual(y)
        ref.extrapolate()
        solver.iterate(y, measure=measure)
    products = []
    monkeypatch.setattr(LayerBlock, "_a", lambda self, l: products.append(l))
    objective, residual = solver.objective_and_residual(y)
    assert products == []
    assert objective == pytest.approx(want[0], rel=1e-12)
    assert residual == pytest.approx(want[1] ** 0.5, rel=1e-12)
    # once reported, or without measuring, the current (extrapolated) iterate
    monkeypatch.undo()
    moved = ref.objective_and_residual(y)
    assert solver.objective_and_residual(y) == pytest.approx((moved[0], moved[1] ** 0.5))
    assert moved[0] != pytest.approx(want[0], rel=1e-6)  # momentum did move it
