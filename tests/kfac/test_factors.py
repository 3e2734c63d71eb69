"""K-FAC factors against explicit computations: [x, 1] rows for Linear, loop-built im2col for Conv2d."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.kfac.factors import (
    input_factor,
    output_factor,
    running_average,
    triu_pack,
    triu_unpack,
)

pytestmark = pytest.mark.usefixtures("float64")


def _output_grad(module: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """dL/ds of the batch-mean cross-entropy of ``module(x)`` (flattened), by autograd."""
    s = module(x)
    s.retain_grad()
    F.cross_entropy(s.flatten(1), y).backward()
    assert s.grad is not None
    return s.grad


def test_linear_factors_are_the_moments_of_inputs_and_per_sample_gradients() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(5, 4)
    x, y = torch.randn(7, 5), torch.randint(0, 4, (7,))
    g = _output_grad(layer, x, y)
    a = torch.cat([x, torch.ones(7, 1)], dim=1)
    assert torch.allclose(input_factor(layer, x), a.T @ a / 7)
    per_sample = 7 * g  # the gradient of each sample's own loss
    assert torch.allclose(output_factor(layer, g), per_sample.T @ per_sample / 7)
    no_bias = nn.Linear(5, 4, bias=False)
    assert torch.allclose(input_factor(no_bias, x), x.T @ x / 7)


def _explicit_patches(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """im2col by loops over output positions: (B, T, C kh kw), independent of F.unfold."""
    kh, kw = conv.kernel_size
    sh, sw = conv.stride
    dh, dw = conv.dilation
    if conv.padding == "same":
        th, tw = dh * (kh - 1), dw * (kw - 1)
        pads = (tw // 2, tw - tw // 2, th // 2, th - th // 2)
    else:
        ph, pw = conv.padding
        pads = (pw, pw, ph, ph)
    mode = "constant" if conv.padding_mode == "zeros" else conv.padding_mode
    xp = F.pad(x, pads, mode=mode)
    out_h = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    out_w = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    rows = []
    for i in range(out_h):
        for j in range(out_w):
            window = xp[
                :,
                :,
                i * sh : i * sh + dh * (kh - 1) + 1 : dh,
                j * sw : j * sw + dw * (kw - 1) + 1 : dw,
            ]
            rows.append(window.reshape(x.shape[0], -1))
    return torch.stack(rows, dim=1)


@pytest.mark.parametrize(
    "options",
    [
        {"kernel_size": 3, "padding": 1},
        {"kernel_size": (3, 2), "stride": 2, "bias": False},
        {"kernel_size": 2, "dilation": 2, "padding": "same", "padding_mode": "reflect"},
    ],
    ids=["pad1", "stride2-nobias", "same-dilated-reflect"],
)
def test_conv_factors_equal_an_explicit_im2col(options: dict) -> None:
    torch.manual_seed(1)
    conv = nn.Conv2d(2, 3, **options)
    x = torch.randn(3, 2, 6, 5)
    out = conv(x)
    y = torch.randint(0, out[0].numel(), (3,))
    g = _output_grad(conv, x, y)  # (B, C_out, H', W')
    patches = _explicit_patches(conv, x)  # (B, T, C kh kw)
    b, t = patches.shape[:2]
    assert t == out.shape[2] * out.shape[3]
    if conv.bias is not None:
        patches = torch.cat([patches, torch.ones(b, t, 1)], dim=2)
    rows = patches.reshape(b * t, -1)
    # A: mean over samples and positions; G: per-sample gradients summed over positions
    assert torch.allclose(input_factor(conv, x), rows.T @ rows / (b * t))
    per_sample = (b * g).permute(0, 2, 3, 1).reshape(b * t, -1)
    assert torch.allclose(output_factor(conv, g), per_sample.T @ per_sample / b)


def test_triangle_packing_round_trips_a_symmetric_matrix() -> None:
    m = torch.randn(5, 5)
    m = m + m.T
    v = triu_pack(m)
    assert v.shape == (15,)
    assert torch.equal(triu_unpack(v, 5), m)


def test_running_average_starts_at_the_first_factor() -> None:
    first, second = torch.eye(2), 3 * torch.eye(2)
    avg = running_average(None, first, 0.9)
    assert torch.equal(avg, first) and avg is not first
    assert torch.allclose(running_average(avg, second, 0.9), 1.2 * torch.eye(2))
