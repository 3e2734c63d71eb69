"""Transparency: distributed pdADMM iterates (and start-up sweeps) equal the serial ones; quantized
exchange shrinks bytes."""

from __future__ import annotations

import itertools

import pytest
import torch

from deepjimu.admm_math.wire import wire_bytes
from deepjimu.balance import partition
from deepjimu.comm import Comm, CommStats
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import (
    Exchange,
    backward_sweep,
    distributed_iteration,
    init_blocks_forward,
    serial_iteration,
)
from distributed import run_world

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow

WIDTHS = [12, 16, 16, 16, 5]  # 4 layers
N, ITERS = 40, 4


def _problem(
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, WIDTHS[0], generator=g)
    y = torch.randint(0, WIDTHS[-1], (N,), generator=g)
    W = [torch.randn(o, i, generator=g) / i**0.5 for i, o in itertools.pairwise(WIDTHS)]
    b = [torch.randn(o, generator=g) * 0.1 for o in WIDTHS[1:]]
    return x, y, W, b


def _snapshot(block: LayerBlock) -> dict[str, torch.Tensor]:
    out = {}
    for name in ("W", "b", "p", "z", "q", "u"):
        for l, t in getattr(block, name).items():
            out[f"{name}{l}"] = t.clone()
    return out


def _copies(block: LayerBlock) -> dict[str, torch.Tensor]:
    """The block's copies of its neighbours' variables, by the serial name they copy."""
    out = {}
    if block.p_right is not None:
        out[f"p{block.hi}"] = block.p_right.clone()
    if block.q_left is not None and block.u_left is not None:
        out |= {f"q{block.lo - 1}": block.q_left.clone(), f"u{block.lo - 1}": block.u_left.clone()}
    return out


def _params(bits: int, momentum: float, ridge: float = 0.0) -> AdmmParams:
    return AdmmParams(rho=0.5, nu=0.8, bits=bits, tau=1.0, momentum=momentum, ridge=ridge)


def _serial(
    bits: int, momentum: float = 0.0, start: str = "forward", sweeps: int = 0, ridge: float = 0.0
) -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    x, y, W, b = _problem()
    block = LayerBlock(0, 4, 4, W, b, _params(bits, momentum, ridge))
    if start == "identity":
        block.identity_start()
    block.init_forward(x, None if start == "forward" else (1.0, 0.0))
    for _ in range(sweeps):
        backward_sweep(block, y)
    for _ in range(ITERS):
        serial_iteration(block, y)
        if momentum:
            block.extrapolate()
    return _snapshot(block)


def _distributed(
    rank: int,
    world: int,
    sizes: list[int],
    bits: int,
    momentum: float = 0.0,
    start: str = "forward",
    sweeps: int = 0,
    ridge: float = 0.0,
) -> tuple[dict[str, torch.Tensor], list[int]]:
    x, y, W, b = _problem()
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    block = LayerBlock(lo, hi, 4, W[lo:hi], b[lo:hi], _params(bits, momentum, ridge))
    stats = CommStats()
    ex = Exchange(Comm(stats), bits, torch.device("cpu"))
    if start == "identity":  # layers 1 and 2, 16 x 16, wherever they are
        block.identity_start()
    init_blocks_forward(block, x if rank == 0 else None, N, ex, rank, world, start != "forward")
    for _ in range(sweeps):
        backward_sweep(block, y if hi == 4 else None, ex, rank, world)
    sent = []
    for _ in range(ITERS):
        before = stats.bytes_sent
        distributed_iteration(block, y if hi == 4 else None, ex, rank, world)
        if momentum:
            block.extrapolate()
        sent.append(stats.bytes_sent - before)
    return _snapshot(block), sent, _copies(block)


@pytest.mark.parametrize(
    "bits,momentum,start,sweeps,ridge",
    [
        (0, 0.0, "forward", 0, 0.0),
        (8, 0.0, "forward", 0, 0.0),
        (8, 0.5, "scaled", 0, 0.0),
        (0, 0.5, "forward", 2, 0.01),  # the defaults' kind: start-up sweeps and a ridge
        (0, 0.7, "identity", 1, 0.01),  # a deep MLP's defaults
        (8, 0.5, "forward", 1, 0.003),
        (4, 0.5, "forward", 1, 0.003),  # changes on per-row grids, momentum, a sweep
        (4, 0.0, "scaled", 0, 0.0),
        (2, 0.5, "forward", 2, 0.01),
    ],
)
def test_distributed_iterates_equal_serial(
    bits: int, momentum: float, start: str, sweeps: int, ridge: float
) -> None:
    serial = _serial(bits, momentum, start, sweeps, ridge)
    # the last: the split --balance speed makes for a second worker at 0.3 of the first's speed
    by_speed = partition([1.0] * 4, 2, speeds=[1.0, 0.3])
    assert by_speed == [3, 1]
    for sizes in ([2, 2], [1, 2, 1], by_speed):
        results = run_world(_distributed, len(sizes), sizes, bits, momentum, start, sweeps, ridge)
        merged: dict[str, torch.Tensor] = {}
        for snap, _, _ in results:
            merged.update(snap)
        assert merged.keys() == serial.keys()
        # and every copy of a neighbour's variable equals the variable it copies
        copies = [(f"copy of {k}", t, serial[k]) for _, _, c in results for k, t in c.items()]
        assert len(copies) == 3 * (len(sizes) - 1)
        for k, got, want in [*((k, merged[k], serial[k]) for k in serial), *copies]:
            torch.testing.assert_close(
                got,
                want,
                rtol=1e-5,
                atol=1e-5,
                msg=f"{k} ({sizes}, bits {bits}, momentum {momentum})",
            )


def test_quantized_exchange_sends_four_times_fewer_bytes() -> None:
    plain = run_world(_distributed, 2, [2, 2], 0)
    quant = run_world(_distributed, 2, [2, 2], 8)
    for rank in range(2):
        per_iter_plain, per_iter_quant = plain[rank][1][-1], quant[rank][1][-1]
        # float32 p (left) or q (right): 4 bytes per value; 8-bit codes: 1 byte + an 8-byte header
        assert per_iter_plain == N * 16 * 4
        assert per_iter_quant == N * 16 + 8
        assert per_iter_plain / per_iter_quant >= 3


@pytest.mark.parametrize("bits", [0, 2, 4, 8, 16])
def test_the_bytes_of_an_iteration_are_the_formula(bits: int) -> None:
    """Each rank sends one message a iteration (p left, or q right) of N x 16 values, counted
    by the byte counter exactly as ``wire.wire_bytes`` (which the planner uses) says."""
    for sent in (r[1] for r in run_world(_distributed, 2, [2, 2], bits)):
        assert sent == [wire_bytes(N, 16, bits)] * ITERS
