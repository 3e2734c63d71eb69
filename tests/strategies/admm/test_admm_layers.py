"""Layer operators: read off mlp and cnn models, compute the model, and every step lowers the objective."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from deepjimu.admm_math import updates as U
from deepjimu.admm_math.conv import PSolver
from deepjimu.balance import partition
from deepjimu.errors import JimuError
from deepjimu.models import build_model
from deepjimu.strategies.admm.layers import ConvOp, DenseOp, LayerOp, layer_ops

DT = torch.float64


def _maps(model: nn.Sequential) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]


@pytest.mark.parametrize(
    ("spec", "shape"), [("cnn:3-4", (1, 8, 8)), ("cnn:2x4", (1, 7, 5)), ("mlp:6x2", (1, 4, 4))]
)
def test_operators_compute_the_model(spec: str, shape: tuple[int, ...]) -> None:
    model = build_model(spec, shape, num_classes=5).double()
    ops = layer_ops(model, shape)
    x = torch.rand(3, *shape, dtype=DT)
    h = x
    for l, (op, m) in enumerate(zip(ops, _maps(model), strict=True)):
        assert tuple(h.shape[1:]) == op.in_shape
        h = op.forward(h, m.weight, m.bias)
        assert tuple(h.shape[1:]) == op.out_shape
        h = torch.relu(h) if l < len(ops) - 1 else h
    torch.testing.assert_close(h, model(x))


def test_cnn_operators_fold_each_pooling_into_the_next_layer() -> None:
    ops = layer_ops(build_model("cnn:16-32", (1, 8, 8), 10), (1, 8, 8))
    assert ops == [
        ConvOp((1, 8, 8), 16, 3, pool=1, solver=PSolver.DENSE),
        # a 16 x 4 x 4 map: the explicit matrix costs less than CG_ITERS CG iterations
        ConvOp((16, 8, 8), 32, 3, pool=2, solver=PSolver.DENSE),
        DenseOp((32, 4, 4), 10, pool=2),
    ]
    assert ops[2].n_in == 32 * 2 * 2
    big = layer_ops(build_model("cnn:16-32", (1, 28, 28), 10), (1, 28, 28))
    assert [op.solver for op in big[:2]] == [PSolver.CG, PSolver.CG]


def test_dense_costs_count_the_mlp_steps() -> None:
    widths, n = [64, 20, 30, 10], 100
    ops = layer_ops(build_model("mlp:20-30", (1, 8, 8), 10), (1, 8, 8))
    for l, op in enumerate(ops):
        i, o = widths[l], widths[l + 1]
        wb = n * (2 * i * o + i * i) + i**3 / 3  # Gram, z^T p and p W^T; the Cholesky
        p_step = 2 * n * i * o + i**3 / 3 if l > 0 else 0  # layer 1 has no p-step
        assert op.flops(n, with_p=l > 0) == pytest.approx(wb + p_step)
        assert op.nbytes(n) == 4 * (n * (i + 3 * o) + i * o + o)  # p, z, q, u, W, b in fp32
    conv = ConvOp((16, 8, 8), 32, 3, pool=2)
    assert conv.flops(2 * n) > 1.9 * conv.flops(n)  # grows with N
    assert dataclasses.replace(conv, solver=PSolver.DENSE).flops(n) < conv.flops(n)


def test_wide_inputs_and_few_samples_cost_the_kernel_side_and_every_worker_gets_work() -> None:
    """Cora with pdADMM-G's features (7,165 inputs, 140 training nodes, mlp:256x3): the first
    layer's (W, b) step factorises 140 x 140, so its estimate grows with n_in, not n_in^3, and
    two workers split the layers with a real share each (it was [1.0, 0.0])."""
    widths, n = [7165, 256, 256, 256, 7], 140
    ops = layer_ops(build_model("mlp:256x3", (widths[0],), widths[-1]), (widths[0],))
    costs = [op.flops(n, with_p=l > 0) for l, op in enumerate(ops)]
    i, o = widths[0], widths[1]
    assert costs[0] == pytest.approx(n * (2 * i * o + i * n) + n**3 / 3)
    wider = DenseOp((2 * i,), o).flops(n, with_p=False)
    assert 1.9 * costs[0] < wider < 2.1 * costs[0]  # linear in the input width
    sizes = partition(costs, 2)
    assert sizes == [1, 3]
    assert sum(costs[1:]) / sum(costs) > 0.1


def _two_blocks(*first: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Sequential(*first), nn.Sequential(nn.Flatten(), nn.LazyLinear(3)))


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (build_model("lenet", (1, 8, 8), 10), r"cannot train max pooling \(block 0: Conv2d-ReLU-MaxPool2d\): it is not linear"),
        (build_model("resnet", (1, 8, 8), 10), r"cannot train block 0: Conv2d-BatchNorm2d-ReLU"),
        (_two_blocks(nn.Conv2d(1, 2, 3, stride=2, padding=1), nn.ReLU()), r"stride 1, bias \(block 0: Conv2d-ReLU\)"),
        (_two_blocks(nn.Conv2d(1, 2, 4, padding=2), nn.ReLU()), r"odd square kernels"),
        (_two_blocks(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(3, 2)), r"non-overlapping"),
        (_two_blocks(nn.Flatten(), nn.Linear(64, 3), nn.Tanh()), r"cannot train block 0: Flatten-Linear-Tanh"),
    ],
)  # fmt: skip
def test_what_admm_cannot_train_is_one_line(model: nn.Sequential, match: str) -> None:
    with pytest.raises(JimuError, match=match) as e:
        layer_ops(model, (1, 8, 8))
    assert "\n" not in str(e.value)


def _lagrangian(ops: list[LayerOp], v: dict[str, list], y: torch.Tensor, rho: float, nu: float):
    """Problem 2's augmented Lagrangian over operators (``updates`` terms are elementwise sums)."""
    a = [op.forward(v["p"][l], v["W"][l], v["b"][l]) for l, op in enumerate(ops)]
    total = U.last_layer_objective(a[-1], v["z"][-1], y, nu)
    for l in range(len(ops) - 1):
        total = total + U.layer_lagrangian(
            a[l], v["z"][l], v["q"][l], v["u"][l], v["p"][l + 1], rho, nu
        )
    return total


@pytest.mark.parametrize("step", ["p cg", "p dense", "Wb", "z", "q"])
def test_every_step_lowers_the_augmented_lagrangian(step: str) -> None:
    g = torch.Generator().manual_seed(0)
    model = build_model("cnn:3-4", (1, 6, 6), num_classes=3).double()
    ops = layer_ops(model, (1, 6, 6))
    N, rho, nu = 5, 0.8, 1.2

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(N, *shape, dtype=DT, generator=g)

    v: dict[str, list] = {
        "W": [m.weight.detach() for m in _maps(model)],
        "b": [m.bias.detach() for m in _maps(model)],
        "p": [rand(*op.in_shape) for op in ops],
        "z": [rand(*op.out_shape) for op in ops],
        "q": [rand(*op.out_shape) for op in ops[:-1]],
        "u": [rand(*op.out_shape) for op in ops[:-1]],
    }
    y = torch.randint(0, 3, (N,), generator=g)
    before = _lagrangian(ops, v, y, rho, nu)
    L = len(ops)
    if step.startswith("p"):
        solver = PSolver.CG if step == "p cg" else PSolver.DENSE
        for l in range(1, L):
            op = (
                dataclasses.replace(ops[l], solver=solver) if isinstance(ops[l], ConvOp) else ops[l]
            )
            args = (v["W"][l], v["b"][l], v["z"][l], v["q"][l - 1], v["u"][l - 1], rho, nu)
            v["p"][l] = op.solve_p(*args, p_old=v["p"][l]).p
    elif step == "Wb":
        for l, op in enumerate(ops):
            v["W"][l], v["b"][l] = op.solve_Wb(v["p"][l], v["z"][l], v["W"][l], nu)
    elif step == "z":
        for l, op in enumerate(ops):
            a = op.forward(v["p"][l], v["W"][l], v["b"][l])
            v["z"][l] = (
                U.update_z_last(a, y, v["z"][l], nu).z
                if l == L - 1
                else U.update_z_hidden(a, v["q"][l], v["z"][l])
            )
    else:
        v["q"] = [U.update_q(v["p"][l + 1], v["u"][l], v["z"][l], rho, nu) for l in range(L - 1)]
    after = _lagrangian(ops, v, y, rho, nu)
    assert after < before - 1e-3 * abs(before)
