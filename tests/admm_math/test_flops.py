"""The analytic FLOP count of a pdADMM iteration against the operations the iteration really runs."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deepjimu.admm_math.flops import iteration_flops
from deepjimu.strategies.admm.blocks import AdmmParams, LayerBlock
from deepjimu.strategies.admm.driver import serial_iteration

aten = torch.ops.aten


class _Counted(TorchDispatchMode):
    """FLOPs of every matmul, Cholesky factor and Cholesky solve that reaches the dispatcher,
    by kind, with the conventions of ``flops.py`` (written apart from it, from the shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter[str] = Counter()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.seen[name] += 1
        if func.overloadpacket in (aten.mm, aten.addmm, aten.addmm_):
            a, b = (args[0], args[1]) if func.overloadpacket is aten.mm else (args[1], args[2])
            self.flops["matmul"] += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        elif func.overloadpacket in (aten.linalg_cholesky_ex, aten.cholesky):
            self.flops["factor"] += args[0].shape[-1] ** 3 / 3
        elif func.overloadpacket in (aten.cholesky_solve, aten._cholesky_solve_helper):
            b, factor = args[0], args[1]
            self.flops["solve"] += 2 * factor.shape[-1] ** 2 * b.shape[-1]
        return out


def _block(widths: list[int], n: int) -> tuple[LayerBlock, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    W = [
        torch.randn(o, i, generator=g, dtype=torch.float64) / i**0.5
        for i, o in itertools.pairwise(widths)
    ]
    b = [torch.zeros(o, dtype=torch.float64) for o in widths[1:]]
    L = len(W)
    block = LayerBlock(0, L, L, W, b, AdmmParams(1e-2, 1e-2, tau=1.0))
    x = torch.randn(n, widths[0], generator=g, dtype=torch.float64)
    block.init_forward(x)
    return block, torch.randint(0, widths[-1], (n,), generator=g)


@pytest.mark.parametrize(
    ("widths", "n"),
    [
        ([6, 4, 9, 3], 20),  # both p-step sides, the Gram side of every (W, b) step
        ([300, 260, 5], 40),  # N <= n_in: the kernel side; a wide p-step
        ([12, 300, 5], 500),  # a Gram of 300 columns in strips
    ],
)
def test_the_count_equals_the_operations_an_iteration_runs(widths: list[int], n: int) -> None:
    block, y = _block(widths, n)
    for kept in (False, True):  # the first iteration forms the data's Gram, later ones keep it
        with _Counted() as counted:
            serial_iteration(block, y)
        predicted: Counter[str] = Counter()
        for c in iteration_flops(widths, n, data_gram_kept=kept):
            predicted[c.kind] += c.flops
        assert counted.seen["linalg_pinv"] == 0
        assert min(counted.flops[k] for k in ("matmul", "factor", "solve")) > 0
        for kind in ("matmul", "factor", "solve"):
            assert counted.flops[kind] == pytest.approx(predicted[kind], rel=1e-12), (kind, kept)


def test_a_hand_count_of_one_small_layer() -> None:
    # one layer 3 -> 2 over 5 samples: (W, b) by the 3 x 3 Gram, then a = p W^T
    counts = {(c.name, c.flops) for c in iteration_flops([3, 2], 5, data_gram_kept=False)}
    assert counts == {
        ("p^T p", 2 * 3 * 5 * 3),
        ("z^T p", 2 * 2 * 5 * 3),
        ("chol G", 9.0),
        ("W", 2 * 9 * 2),
        ("a = p W^T", 2 * 5 * 3 * 2),
    }
    # a middle layer of a block adds its p-step (n_out = 2 <= n_in = 3: through K [2, 2])
    middle = iteration_flops([4, 3, 2], 5, layers=[1])
    assert [c.name for c in middle][:5] == ["W W^T", "chol K", "K^-1 W", "v W^T", "r M"]
    with pytest.raises(ValueError, match=r"layers must lie in 0\.\.1"):
        iteration_flops([4, 3, 2], 5, layers=[2])
