"""OpBlock: LayerBlock's iterates on an MLP; on a CNN, distributed iterates equal the serial ones."""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn

from deepjimu.comm import Comm, CommStats
from deepjimu.models import build_model
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.conv import PSolver
from deepjimu.strategies.admm.driver import Exchange, distributed_iteration, serial_iteration
from deepjimu.strategies.admm.layers import ConvOp, DenseOp, layer_ops, unit_scales
from deepjimu.strategies.admm.opblock import OpBlock
from deepjimu.strategies.admm.quantize import project
from distributed import run_world

N, ITERS = 24, 6  # the labels reach the first conv p-step at iteration 6
SPEC, SHAPE, CLASSES = "cnn:3-4-5", (1, 8, 8), 4  # 4 layers: three 3x3 convs, each pooled, dense
PARAMS = {"rho": 0.5, "nu": 0.8, "tau": 1.0}


def _snapshot(block: LayerBlock | OpBlock) -> dict[str, torch.Tensor]:
    return {
        f"{name}{l}": t.clone()
        for name in ("W", "b", "p", "z", "q", "u")
        for l, t in getattr(block, name).items()
    }


def test_opblock_iterates_equal_layerblock_on_an_mlp() -> None:
    g = torch.Generator().manual_seed(0)
    widths = [12, 16, 16, 16, 5]
    x = torch.randn(N, widths[0], dtype=torch.float64, generator=g)
    y = torch.randint(0, widths[-1], (N,), generator=g)
    W = [
        torch.randn(o, i, dtype=x.dtype, generator=g) / i**0.5
        for i, o in itertools.pairwise(widths)
    ]
    b = [0.1 * torch.randn(o, dtype=x.dtype, generator=g) for o in widths[1:]]
    ops = [DenseOp((i,), o) for i, o in itertools.pairwise(widths)]
    ref = LayerBlock(0, 4, 4, W, b, AdmmParams(**PARAMS))
    new = OpBlock(0, 4, 4, ops, W, b, AdmmParams(**PARAMS))
    for block in (ref, new):
        block.init_forward(x)
        for _ in range(ITERS):
            serial_iteration(block, y)  # type: ignore[arg-type]
    torch.testing.assert_close(_snapshot(new), _snapshot(ref), rtol=1e-12, atol=1e-12)


def _cnn() -> tuple[list, list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    model = build_model(SPEC, SHAPE, CLASSES, seed=0)
    ops = [
        dataclasses.replace(op, solver=PSolver.CG, cg_tol=1e-6) if isinstance(op, ConvOp) else op
        for op in layer_ops(model, SHAPE)
    ]
    g = torch.Generator().manual_seed(1)
    x = torch.rand(N, *SHAPE, generator=g)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    maps = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    W, b, _ = unit_scales(
        ops, [m.weight.detach() for m in maps], [m.bias.detach() for m in maps], x
    )
    return ops, W, b, x, y


def _serial(bits: int) -> tuple[dict[str, torch.Tensor], int]:
    torch.set_num_threads(1)
    ops, W, b, x, y = _cnn()
    block = OpBlock(0, len(ops), len(ops), ops, W, b, AdmmParams(**PARAMS, bits=bits))
    block.init_forward(x)
    for _ in range(ITERS):
        serial_iteration(block, y)  # type: ignore[arg-type]
    return _snapshot(block), block.cg_iters


def _distributed(
    rank: int, world: int, sizes: list[int], bits: int
) -> tuple[dict[str, torch.Tensor], list[int]]:
    ops, W, b, x, y = _cnn()
    L = len(ops)
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    block = OpBlock(lo, hi, L, ops[lo:hi], W[lo:hi], b[lo:hi], AdmmParams(**PARAMS, bits=bits))
    # the start-up forward pass, as driver.init_blocks_forward delivers it: every block's
    # output on the grid (that helper reads the input width off W, so it handles MLPs only)
    h = x
    for l in range(lo):
        h = torch.relu(ops[l].forward(h, W[l], b[l]))
        h = project(h, bits) if bits else h
    block.init_forward(h)
    stats = CommStats()
    ex = Exchange(Comm(stats), bits, torch.device("cpu"))
    sent = []
    for _ in range(ITERS):
        before = stats.bytes_sent
        distributed_iteration(block, y if hi == L else None, ex, rank, world)  # type: ignore[arg-type]
        sent.append(stats.bytes_sent - before)
    return _snapshot(block), sent


def _check_equal(serial: dict[str, torch.Tensor], results: list, what: str) -> None:
    merged: dict[str, torch.Tensor] = {}
    for snap, _ in results:
        merged.update(snap)
    assert merged.keys() == serial.keys()
    for k in serial:
        torch.testing.assert_close(merged[k], serial[k], rtol=1e-5, atol=1e-5, msg=f"{k} ({what})")


def test_cnn_two_workers_iterate_as_one() -> None:
    serial, cg_iters = _serial(0)
    assert cg_iters > 0  # the conv p-steps ran conjugate gradients
    _check_equal(serial, run_world(_distributed, 2, [2, 2], 0), "[2, 2]")


def test_cnn_three_workers_iterate_as_one_and_8_bits_send_4x_fewer_bytes() -> None:
    plain = run_world(_distributed, 3, [1, 2, 1], 0)
    _check_equal(_serial(0)[0], plain, "[1, 2, 1]")
    quant = run_world(_distributed, 3, [1, 2, 1], 8)
    _check_equal(_serial(8)[0], quant, "[1, 2, 1], 8 bits")
    for rank in range(3):
        # feature maps cross the boundaries: 1-byte codes (+ an 8-byte header per message)
        assert plain[rank][1][-1] >= 3 * quant[rank][1][-1] > 0
