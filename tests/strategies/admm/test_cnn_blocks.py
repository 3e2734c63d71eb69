"""LayerBlock on a CNN: the unit start, CG counters, and distributed iterates equal the serial ones."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from torch import nn

from deepjimu.admm_math.conv import PSolver
from deepjimu.comm import Comm, CommStats
from deepjimu.models import build_model
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import (
    Exchange,
    distributed_iteration,
    init_blocks_forward,
    serial_iteration,
)
from deepjimu.strategies.admm.layers import ConvOp, layer_ops
from distributed import run_world

N, ITERS = 24, 6  # the labels reach the first conv p-step at iteration 6
SPEC, SHAPE, CLASSES = "cnn:3-4-5", (1, 8, 8), 4  # 4 layers: three 3x3 convs, each pooled, dense
PARAMS = {"rho": 0.5, "nu": 0.8, "tau": 1.0}


def _snapshot(block: LayerBlock) -> dict[str, torch.Tensor]:
    return {
        f"{name}{l}": t.clone()
        for name in ("W", "b", "p", "z", "q", "u")
        for l, t in getattr(block, name).items()
    }


def _cnn(
    spec: str = SPEC, cg_max_iter: int = 50
) -> tuple[nn.Sequential, list, list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    model = build_model(spec, SHAPE, CLASSES, seed=0)
    ops = [
        dataclasses.replace(op, solver=PSolver.CG, cg_tol=1e-6, cg_max_iter=cg_max_iter)
        if isinstance(op, ConvOp)
        else op
        for op in layer_ops(model, SHAPE)
    ]
    g = torch.Generator().manual_seed(1)
    x = torch.rand(N, *SHAPE, generator=g)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    maps = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    W = [m.weight.detach().clone() for m in maps]
    b = [m.bias.detach().clone() for m in maps]
    return model, ops, W, b, x, y


def test_unit_start_keeps_the_function_and_gives_every_hidden_layer_unit_rms() -> None:
    model, ops, W, b, x, _ = _cnn()
    model, x = model.double(), x.double()
    W, b = [w.double() for w in W], [v.double() for v in b]
    block = LayerBlock(0, len(ops), len(ops), W, b, AdmmParams(), ops)
    out, carry = block.init_forward(x, (1.0, 0.0), unit=True)
    assert carry is not None and carry[0] < 1  # torch's init shrinks the activations
    torch.testing.assert_close(out, model(x))  # the network's function is unchanged
    torch.testing.assert_close(block.forward(x), model(x))
    for l in range(len(ops) - 1):
        torch.testing.assert_close(block.q[l].square().mean().sqrt().item(), 1.0)


def test_cg_cap_hits_are_counted_and_kept_in_checkpoints() -> None:
    _, ops, W, b, x, y = _cnn(cg_max_iter=1)
    block = LayerBlock(0, len(ops), len(ops), W, b, AdmmParams(**PARAMS), ops)
    block.init_forward(x, (1.0, 0.0), unit=True)
    for _ in range(ITERS):
        serial_iteration(block, y)
    assert block.cg_solves == ITERS * 2  # conv layers 2 and 3 solve their p-step by CG
    assert 0 < block.cg_hits <= block.cg_iters <= block.cg_solves  # at most one iteration each
    buf = io.BytesIO()
    torch.save(block.state_dict(), buf)
    buf.seek(0)
    other = LayerBlock(0, len(ops), len(ops), W, b, AdmmParams(**PARAMS), ops)
    other.load_state_dict(torch.load(buf, weights_only=True), torch.device("cpu"))
    assert (other.cg_iters, other.cg_solves, other.cg_hits) == (
        block.cg_iters,
        block.cg_solves,
        block.cg_hits,
    )


def _serial(bits: int) -> tuple[dict[str, torch.Tensor], int]:
    torch.set_num_threads(1)
    _, ops, W, b, x, y = _cnn()
    block = LayerBlock(0, len(ops), len(ops), W, b, AdmmParams(**PARAMS, bits=bits), ops)
    block.init_forward(x, (1.0, 0.0), unit=True)
    for _ in range(ITERS):
        serial_iteration(block, y)
    return _snapshot(block), block.cg_iters


def _distributed(
    rank: int, world: int, sizes: list[int], bits: int
) -> tuple[dict[str, torch.Tensor], list[int]]:
    _, ops, W, b, x, y = _cnn()
    L = len(ops)
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    params = AdmmParams(**PARAMS, bits=bits)
    block = LayerBlock(lo, hi, L, W[lo:hi], b[lo:hi], params, ops[lo:hi])
    stats = CommStats()
    ex = Exchange(Comm(stats), bits, torch.device("cpu"))
    # the unit start's chain: feature maps and the factor cross the boundaries
    init_blocks_forward(block, x if rank == 0 else None, N, ex, rank, world, True, True)
    sent = []
    for _ in range(ITERS):
        before = stats.bytes_sent
        distributed_iteration(block, y if hi == L else None, ex, rank, world)
        sent.append(stats.bytes_sent - before)
    return _snapshot(block), sent


def _check_equal(serial: dict[str, torch.Tensor], results: list, what: str) -> None:
    merged: dict[str, torch.Tensor] = {}
    for snap, _ in results:
        merged.update(snap)
    assert merged.keys() == serial.keys()
    for k in serial:
        torch.testing.assert_close(merged[k], serial[k], rtol=1e-5, atol=1e-5, msg=f"{k} ({what})")


@pytest.mark.slow
def test_cnn_two_workers_iterate_as_one() -> None:
    serial, cg_iters = _serial(0)
    assert cg_iters > 0  # the conv p-steps ran conjugate gradients
    _check_equal(serial, run_world(_distributed, 2, [2, 2], 0), "[2, 2]")


@pytest.mark.slow
def test_cnn_three_workers_iterate_as_one_and_8_bits_send_3x_fewer_bytes() -> None:
    plain = run_world(_distributed, 3, [1, 2, 1], 0)
    _check_equal(_serial(0)[0], plain, "[1, 2, 1]")
    quant = run_world(_distributed, 3, [1, 2, 1], 8)
    _check_equal(_serial(8)[0], quant, "[1, 2, 1], 8 bits")
    for rank in range(3):
        # feature maps cross the boundaries: 1-byte codes (+ an 8-byte header per message)
        assert plain[rank][1][-1] >= 3 * quant[rank][1][-1] > 0


@pytest.mark.slow
def test_cnn_two_workers_iterate_as_one_at_4_bits() -> None:
    """[N, C, H, W] maps change on one grid per sample, their codes packed two to a byte."""
    quant = run_world(_distributed, 2, [2, 2], 4)
    _check_equal(_serial(4)[0], quant, "[2, 2], 4 bits")
    plain = run_world(_distributed, 2, [2, 2], 0)
    for rank in range(2):
        assert plain[rank][1][-1] >= 6 * quant[rank][1][-1] > 0
