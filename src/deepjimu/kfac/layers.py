"""One layer under K-FAC: the hooks that collect its factors, its running A and G, its gradient matrix."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from deepjimu.kfac.factors import KFAC_MODULES, input_factor, output_factor
from deepjimu.kfac.precondition import Decomposition

__all__ = ["KFACLayer", "kfac_candidates"]


def kfac_candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The (name, module) pairs K-FAC can precondition: trainable Linear and ungrouped Conv2d layers.

    Whether they take part is decided later, by whether their hooks fire in a training step.
    """
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, KFAC_MODULES) and getattr(m, "groups", 1) == 1 and m.weight.requires_grad
    ]


class KFACLayer:
    """An ``nn.Linear`` or ``nn.Conv2d`` with a forward hook on its input and a tensor hook on
    its output's gradient (not a full backward hook, which in-place ops downstream break).

    While :attr:`collect` is set, every training forward pass adds its batch's A and the
    backward pass its G (:mod:`deepjimu.kfac.factors`); :meth:`batch_factors` takes their
    mean. :attr:`fired` records that both hooks ran, i.e. that the layer is really used.

    Args:
        name: the module's qualified name in the model (the same on every rank).
        module: the layer.
    """

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name, self.module = name, module
        # typed handles on the layer's parameters (nn.Module's attributes are untyped)
        self.weight: Tensor = module.weight  # type: ignore[assignment]
        self.bias: Tensor | None = module.bias  # type: ignore[assignment]
        self.n_g = self.weight.shape[0]
        self.n_a = self.weight[0].numel() + (self.bias is not None)
        self.collect = True
        self.fired = False
        self.A: Tensor | None = None
        self.G: Tensor | None = None
        self.decomposition: Decomposition | None = None
        self._a: list[Tensor] = []
        self._g: list[Tensor] = []
        self._handle = module.register_forward_hook(self._forward)

    def _forward(self, module: nn.Module, inputs: tuple[Any, ...], output: Tensor) -> None:
        # evaluation (eval mode or no_grad) leaves no trace in the factors
        if not (self.collect and module.training and output.requires_grad):
            return
        x = inputs[0].detach().to(self.weight.dtype)
        # factors in the parameters' dtype even under bf16 autocast (eigh needs float32)
        with torch.autocast(x.device.type, enabled=False):
            self._a.append(input_factor(module, x))
        output.register_hook(self._backward)

    def _backward(self, grad: Tensor) -> None:
        self._g.append(output_factor(self.module, grad.detach().to(self.weight.dtype)))
        self.fired = True

    def batch_factors(self) -> tuple[Tensor, Tensor]:
        """A and G of the batches seen since the last call (mean over forward passes).

        Raises:
            RuntimeError: no forward and backward pass was collected.
        """
        if not self._a or not self._g:
            raise RuntimeError(f"K-FAC layer {self.name}: no factors were collected this step")
        a, g = torch.stack(self._a).mean(0), torch.stack(self._g).mean(0)
        self._a, self._g = [], []
        return a, g

    def grad(self) -> Tensor:
        """A copy of the (n_g, n_a) gradient matrix ``[dW | db]`` (conv kernels flattened per channel)."""
        w = self.weight.grad
        if w is None:
            raise RuntimeError(f"K-FAC layer {self.name} has no gradient this step")
        parts = [w.reshape(self.n_g, -1)]
        if self.bias is not None:
            parts.append(self.bias.grad.reshape(-1, 1))  # type: ignore[union-attr]
        return torch.cat(parts, dim=1)

    def set_grad(self, m: Tensor) -> None:
        """Write the (n_g, n_a) matrix ``m`` back into the weight's and bias's ``.grad``."""
        w = self.weight.grad
        assert w is not None
        has_bias = self.bias is not None
        w.copy_(m[:, : m.shape[1] - has_bias].reshape(w.shape))
        if self.bias is not None:
            self.bias.grad.copy_(m[:, -1])  # type: ignore[union-attr]

    def remove(self) -> None:
        """Detach the forward hook (the layer takes no part)."""
        self._handle.remove()
