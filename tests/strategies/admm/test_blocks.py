"""LayerBlock: the scaled start, momentum's bookkeeping and checkpoints that torch reads safely."""

from __future__ import annotations

import io
import itertools

import torch

from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import serial_iteration

WIDTHS = [6, 8, 8, 3]


def _block(params: AdmmParams, seed: int = 0) -> tuple[LayerBlock, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(30, WIDTHS[0], generator=g)
    y = torch.randint(0, WIDTHS[-1], (30,), generator=g)
    W = [torch.randn(o, i, generator=g) * 0.05 for i, o in itertools.pairwise(WIDTHS)]
    b = [torch.randn(o, generator=g) * 0.01 for o in WIDTHS[1:]]
    return LayerBlock(0, 3, 3, W, b, params), x, y


def test_scaled_start_gives_every_layer_the_first_rms_and_keeps_the_predictions() -> None:
    block, x, _ = _block(AdmmParams())
    before = block.forward(x)
    W0 = block.W[0].clone()
    block.init_forward(x, scale=(1.0, 0.0))
    assert torch.equal(block.W[0], W0)  # the first layer keeps its weights
    first = float(block.z[0].square().mean().sqrt())
    for l in block.layers:
        rms = float(block.z[l].square().mean().sqrt())
        assert abs(rms / first - 1) < 1e-5, (l, rms, first)
    after = block.forward(x)
    ratio = after / before  # ReLU is positively homogeneous: one positive factor overall
    assert float(ratio.min()) > 0
    torch.testing.assert_close(
        ratio, torch.full_like(ratio, float(ratio.mean())), rtol=1e-4, atol=0
    )
    assert torch.equal(after.argmax(1), before.argmax(1))


def test_momentum_zero_changes_nothing_and_first_call_only_records() -> None:
    plain, x, y = _block(AdmmParams())
    moved, _, _ = _block(AdmmParams(momentum=0.0))
    for blk in (plain, moved):
        blk.init_forward(x)
    for _ in range(3):
        serial_iteration(plain, y)
        serial_iteration(moved, y)
        moved.extrapolate()
    for l in plain.layers:
        torch.testing.assert_close(moved.W[l], plain.W[l])
    fresh, _, _ = _block(AdmmParams(momentum=0.9))
    fresh.init_forward(x)
    serial_iteration(fresh, y)
    W = {l: w.clone() for l, w in fresh.W.items()}
    fresh.extrapolate()  # nothing to extrapolate from yet
    assert all(torch.equal(fresh.W[l], W[l]) for l in fresh.layers)


def test_state_dict_round_trips_through_weights_only_load() -> None:
    block, x, y = _block(AdmmParams(momentum=0.5, memory=0.9))
    block.init_forward(x)
    for _ in range(2):
        serial_iteration(block, y)
        block.extrapolate()
    block.commit_batch()
    buf = io.BytesIO()
    torch.save(block.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    other, _, _ = _block(AdmmParams(momentum=0.5, memory=0.9), seed=1)
    other.load_state_dict(state, torch.device("cpu"))
    for a, b in ((block, other),):
        serial_iteration(a, y)
        serial_iteration(b, y)
        a.extrapolate()
        b.extrapolate()
        for l in a.layers:
            torch.testing.assert_close(a.W[l], b.W[l])
            torch.testing.assert_close(a.z[l], b.z[l])
    assert other.stats[0] is not None and other.stats[0].n == block.stats[0].n
