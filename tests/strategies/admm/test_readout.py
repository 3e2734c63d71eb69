"""The readout (``--admm-readout``): exact refits, the auto choice, serial = distributed, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from deepjimu.comm import Comm, CommStats
from deepjimu.config import RunConfig
from deepjimu.launch import train
from deepjimu.models import build_model
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import (
    Exchange,
    distributed_iteration,
    init_blocks_forward,
    readout_chain,
    serial_iteration,
)
from deepjimu.strategies.admm.layers import layer_ops
from distributed import run_world

N, ITERS, CLASSES = 40, 4, 3
CASES = {  # spec, one sample's shape
    "mlp": ("mlp:12x3", (10,)),
    "cnn": ("cnn:3-4", (1, 8, 8)),
}


def _setup(case: str, dtype: torch.dtype = torch.float32) -> tuple:
    spec, shape = CASES[case]
    model = build_model(spec, shape, CLASSES, seed=0).to(dtype)
    ops = layer_ops(model, shape)
    g = torch.Generator().manual_seed(3)
    x = torch.rand(N, *shape, generator=g, dtype=dtype)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    maps = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    W = [m.weight.detach().clone() for m in maps]
    b = [m.bias.detach().clone() for m in maps]
    return ops, W, b, x, y


def _serial_block(case: str, bits: int = 0, dtype: torch.dtype = torch.float32) -> tuple:
    ops, W, b, x, y = _setup(case, dtype)
    L = len(ops)
    block = LayerBlock(0, L, L, W, b, AdmmParams(ridge=0.01, bits=bits), ops)
    block.init_forward(x)
    for _ in range(ITERS):
        serial_iteration(block, y)
    return block, x, y


def _forward(block: LayerBlock, weights: dict, x: torch.Tensor) -> torch.Tensor:
    for l in block.layers:
        x = block.ops[l].forward(x, *weights[l])
        if l < block.L - 1:
            x = torch.relu(x)
    return x


def test_every_refitted_layer_is_the_exact_least_squares_on_the_refitted_inputs() -> None:
    """An independent minimisation: lstsq of [h, 1] against z_l, with the ridge as extra rows."""
    block, x, _ = _serial_block("mlp", dtype=torch.float64)
    before = {l: (w.clone(), block.b[l].clone()) for l, w in block.W.items()}
    _, logits = block.readout_forward(None, x)
    h = x
    for l in block.layers:
        W, b = block.refit_Wb[l]
        # ridge_weight: ridge * nu * mean eigenvalue of the centred Gram, on W only
        hc = h - h.mean(0)
        mu = 0.01 * float(torch.trace(hc.T @ hc)) / h.shape[1]
        A = torch.cat([torch.cat([h, torch.ones(N, 1, dtype=h.dtype)], 1),
                       torch.cat([mu**0.5 * torch.eye(h.shape[1], dtype=h.dtype),
                                  torch.zeros(h.shape[1], 1, dtype=h.dtype)], 1)])  # fmt: skip
        B = torch.cat([block.z[l], torch.zeros(h.shape[1], block.z[l].shape[1], dtype=h.dtype)])
        sol = torch.linalg.lstsq(A, B).solution
        torch.testing.assert_close(W, sol[:-1].T, rtol=1e-7, atol=1e-9)
        torch.testing.assert_close(b, sol[-1], rtol=1e-7, atol=1e-9)
        h = h @ W.T + b
        if l < block.L - 1:
            h = torch.relu(h)
    assert logits is not None
    torch.testing.assert_close(logits, h)
    for l, (w, v) in before.items():  # the iterate is left alone
        assert torch.equal(block.W[l], w) and torch.equal(block.b[l], v)


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_takes_the_candidate_with_the_lowest_training_loss(case: str) -> None:
    block, x, y = _serial_block(case)
    plain, refit = block.readout_forward(x, x)
    choice = block.readout_choice(plain, refit, y, "auto")
    losses = {
        name: float(F.cross_entropy(_forward(block, block.readout_weights(name), x), y))
        for name in ("iterate", "last", "all")
    }
    assert choice == min(losses, key=lambda k: losses[k])
    # the three really differ: the refits are not the iterate
    assert len({round(v, 6) for v in losses.values()}) == 3
    assert losses[choice] <= losses["iterate"]


def _distributed(rank: int, world: int, case: str, sizes: list[int], bits: int) -> tuple:
    torch.set_num_threads(1)  # as the serial side: a sum's order follows the thread count
    ops, W, b, x, y = _setup(case)
    L = len(ops)
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    block = LayerBlock(lo, hi, L, W[lo:hi], b[lo:hi], AdmmParams(ridge=0.01, bits=bits), ops[lo:hi])
    ex = Exchange(Comm(CommStats()), bits, torch.device("cpu"))
    init_blocks_forward(block, x if rank == 0 else None, N, ex, rank, world)
    for _ in range(ITERS):
        distributed_iteration(block, y if hi == L else None, ex, rank, world)
    plain, refit = readout_chain(
        block, x if rank == 0 else None, N, ex, rank, world, plain=True, refit=True
    )
    choice = block.readout_choice(plain, refit, y, "auto") if hi == L else None
    weights = {name: block.readout_weights(name) for name in ("iterate", "all")}
    return choice, weights, block.last_Wb


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "sizes", "bits"),
    [("mlp", [2, 2], 0), ("mlp", [1, 2, 1], 8), ("cnn", [1, 2], 0), ("mlp", [1, 2, 1], 4)],
)
def test_distributed_readout_equals_the_serial_one(case: str, sizes: list[int], bits: int) -> None:
    # one thread on both sides: with more, a conv layer's CG sums in another order and the
    # iterates part by 1e-3 after the test's iterations (equal, not the same floats)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        block, x, y = _serial_block(case, bits)
        plain, refit = readout_chain(block, x, N, None, 0, 1, plain=True, refit=True)  # type: ignore[arg-type]
        choice = block.readout_choice(plain, refit, y, "auto")
    finally:
        torch.set_num_threads(before)
    results = run_world(_distributed, len(sizes), case, sizes, bits)
    assert results[-1][0] == choice
    for name in ("iterate", "all"):
        serial = block.readout_weights(name)
        for _, weights, _ in results:
            for l, (W, b) in weights[name].items():
                torch.testing.assert_close(W, serial[l][0], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(b, serial[l][1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[-1][2], block.last_Wb, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_readout_never_fits_worse_than_the_iterate_and_beats_it_here(tmp_path: Path) -> None:
    """The same iterates (the readout does not touch them), evaluated two ways."""
    losses = {}
    for readout in ("iterate", "auto"):
        cfg = RunConfig(model="mlp:32x3", epochs=6, workers=2, quiet=True, admm_readout=readout,
                        runs_dir=str(tmp_path), name=readout)  # fmt: skip
        train(cfg)
        events = [
            json.loads(s) for s in (tmp_path / readout / "events.jsonl").read_text().splitlines()
        ]
        losses[readout] = [e["loss"] for e in events]
        assert {e["admm_readout"] for e in events} <= {"iterate", "last", "all"}
    assert all(a <= i + 1e-9 for a, i in zip(losses["auto"], losses["iterate"], strict=True))
    assert losses["auto"][-1] < losses["iterate"][-1]
