"""K-FAC factors of one batch, A = E[a a^T] and G = E[g g^T], for Linear and Conv2d layers.

Conventions (KFC, Grosse & Martens 2016, for both layer kinds): a layer computes
``s = W a`` at T positions per sample (T = 1 for a Linear layer on flat inputs, the
output pixels of a convolution); ``a`` is the input row (a conv's im2col patch), with a
trailing 1 when the layer has a bias; ``g = B dL/ds`` is the per-sample output gradient of
the batch-mean loss L over B samples. Then

    A = 1/(B T) sum_{i,t} a_it a_it^T        G = 1/B sum_{i,t} g_it g_it^T

so that the Fisher block of ``[W | b]`` is approximated by ``A (x) G`` (mean over positions
for A, sum over positions for G: the spatially uncorrelated derivatives assumption).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "KFAC_MODULES",
    "input_factor",
    "input_rows",
    "output_factor",
    "output_rows",
    "running_average",
    "triu_pack",
    "triu_unpack",
]

KFAC_MODULES = (nn.Linear, nn.Conv2d)


def input_rows(module: nn.Module, x: Tensor) -> Tensor:
    """The rows ``a`` of the layer's input: one per sample and position, ones column for a bias.

    Args:
        module: an ``nn.Linear`` or ``nn.Conv2d``.
        x: its input, (B, ..., in_features) or (B, C, H, W).

    Returns:
        (B T, in + bias) with T positions per sample (conv: im2col patches, C kh kw wide).
    """
    if isinstance(module, nn.Conv2d):
        # padded here, not by unfold: it knows symmetric zero padding only
        patches = F.unfold(
            _pad(module, x), module.kernel_size, dilation=module.dilation, stride=module.stride
        )  # (B, C kh kw, T)
        rows = patches.transpose(1, 2).reshape(-1, patches.shape[1])
    else:
        rows = x.reshape(-1, x.shape[-1])
    if module.bias is not None:
        rows = torch.cat([rows, rows.new_ones(rows.shape[0], 1)], dim=1)
    return rows


def _pad(module: nn.Conv2d, x: Tensor) -> Tensor:
    """``x`` padded as ``module`` pads it (numbers or 'same' / 'valid', any padding mode)."""
    if module.padding == "valid":
        return x
    if module.padding == "same":
        totals = [d * (k - 1) for k, d in zip(module.kernel_size, module.dilation, strict=True)]
    else:
        totals = [2 * int(p) for p in module.padding]
    pads = [side for t in reversed(totals) for side in (t // 2, t - t // 2)]
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    return F.pad(x, pads, mode=mode)


def output_rows(module: nn.Module, grad_output: Tensor) -> Tensor:
    """The rows ``g = B dL/ds`` of the layer's output gradient, one per sample and position.

    Args:
        module: an ``nn.Linear`` or ``nn.Conv2d``.
        grad_output: dL/ds of the batch-mean loss, (B, ..., out) or (B, out, H', W').

    Returns:
        (B T, out).
    """
    batch = grad_output.shape[0]
    if isinstance(module, nn.Conv2d):
        grad_output = grad_output.movedim(1, -1)
    return grad_output.reshape(-1, grad_output.shape[-1]) * batch


def input_factor(module: nn.Module, x: Tensor) -> Tensor:
    """A = 1/(B T) sum a a^T of one batch (see the module docstring).

    Example:
        >>> input_factor(nn.Linear(3, 2), torch.ones(4, 3))
        tensor([[1., 1., 1., 1.],
                [1., 1., 1., 1.],
                [1., 1., 1., 1.],
                [1., 1., 1., 1.]])
    """
    rows = input_rows(module, x)
    return rows.T @ rows / rows.shape[0]


def output_factor(module: nn.Module, grad_output: Tensor) -> Tensor:
    """G = 1/B sum g g^T of one batch (see the module docstring)."""
    rows = output_rows(module, grad_output)
    return rows.T @ rows / grad_output.shape[0]


def running_average(old: Tensor | None, new: Tensor, decay: float) -> Tensor:
    """``decay old + (1 - decay) new``; the first batch's factor when there is no old one."""
    return new.clone() if old is None else old.mul(decay).add_(new, alpha=1 - decay)


def triu_pack(m: Tensor) -> Tensor:
    """The upper triangle (diagonal included) of the square ``m``, row by row, as a vector."""
    i, j = torch.triu_indices(m.shape[0], m.shape[1], device=m.device)
    return m[i, j]


def triu_unpack(v: Tensor, n: int) -> Tensor:
    """The symmetric n x n matrix whose upper triangle :func:`triu_pack` gave as ``v``."""
    i, j = torch.triu_indices(n, n, device=v.device)
    m = v.new_zeros(n, n)
    m[i, j] = v
    m[j, i] = v
    return m
