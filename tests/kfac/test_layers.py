"""K-FAC hooks: tensor hooks survive in-place ops, only layers that ran are kept, eval leaves no trace."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from deepjimu.kfac.layers import KFACLayer
from deepjimu.kfac.preconditioner import KFACPreconditioner, KFACSettings

pytestmark = pytest.mark.usefixtures("float64")


def test_factors_from_hooks_with_an_in_place_relu_downstream() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(inplace=True), nn.Linear(5, 3))
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    layer = KFACLayer("0", model[0])
    F.cross_entropy(model(x), y).backward()  # a full backward hook would raise here
    a, g = layer.batch_factors()
    # the same weights without the in-place op, output gradient by autograd
    plain = copy.deepcopy(model)
    plain[1] = nn.ReLU()
    s = plain[0](x)
    s.retain_grad()
    F.cross_entropy(plain[2](plain[1](s)), y).backward()
    rows = torch.cat([x, torch.ones(6, 1)], dim=1)
    assert torch.allclose(a, rows.T @ rows / 6)
    assert s.grad is not None
    assert torch.allclose(g, (6 * s.grad).T @ (6 * s.grad) / 6)


def test_only_layers_whose_hooks_fired_are_preconditioned() -> None:
    class WithSpare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(3, 2)
            self.spare = nn.Linear(3, 2)  # registered by type, never called
            self.frozen = nn.Linear(2, 2)
            self.frozen.requires_grad_(False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.frozen(self.used(x))

    model = WithSpare()
    pre = KFACPreconditioner(model, KFACSettings())
    model(torch.randn(4, 3)).sum().backward()
    pre.step(lr=0.1)
    assert pre.layers is not None
    assert [layer.name for layer in pre.layers] == ["used"]
    assert not model.spare._forward_hooks and not model.frozen._forward_hooks
    assert model.used._forward_hooks


def test_evaluation_passes_collect_nothing() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    layer = KFACLayer("0", model[0])
    with torch.no_grad():
        model(torch.randn(4, 3))
    model.eval()
    model(torch.randn(4, 3)).sum().backward()
    assert not layer.fired and not layer._a and not layer._g
    model.train()
    model(torch.randn(4, 3)).sum().backward()
    assert layer.fired and len(layer._a) == len(layer._g) == 1


def test_gradient_matrix_round_trips_for_conv_and_linear() -> None:
    for module in (nn.Conv2d(2, 3, 3), nn.Conv2d(2, 3, 3, bias=False), nn.Linear(4, 2)):
        layer = KFACLayer("m", module)
        for p in module.parameters():
            p.grad = torch.randn_like(p)
        m = layer.grad()
        assert m.shape == (layer.n_g, layer.n_a)
        assert torch.equal(
            m[:, : module.weight[0].numel()], module.weight.grad.reshape(layer.n_g, -1)
        )
        layer.set_grad(2 * m)
        assert torch.equal(layer.grad(), 2 * m)


def test_factors_stay_in_the_parameters_dtype_under_bf16_autocast() -> None:
    model = nn.Sequential(nn.Linear(3, 2, dtype=torch.float32))  # autocast leaves float64 alone
    layer = KFACLayer("0", model[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(4, 3, dtype=torch.float32))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    a, g = layer.batch_factors()
    assert a.dtype == g.dtype == torch.float32
