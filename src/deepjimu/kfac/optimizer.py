"""KFAC: SGD with momentum on K-FAC-preconditioned gradients (``--optimizer kfac``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from deepjimu.comm import Comm
from deepjimu.kfac.preconditioner import KFACPreconditioner, KFACSettings

__all__ = ["KFAC"]


class KFAC(torch.optim.SGD):
    """``torch.optim.SGD`` whose step first preconditions the gradients with K-FAC.

    Momentum and weight decay act on the preconditioned (and KL-clipped) gradients, as in
    KAISA. The K-FAC state (running factors, decompositions, step count) is part of
    :meth:`state_dict`, so a checkpoint resumes exactly.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 3))
        >>> opt = KFAC(model.parameters(), model, lr=0.1, momentum=0.9)
        >>> model(torch.randn(8, 4)).square().mean().backward()
        >>> opt.step()

    Args:
        params: the parameters to optimise (all of ``model``'s, or DDP's view of them).
        model: the module whose Linear and Conv2d layers are preconditioned.
        lr, momentum, weight_decay: as for SGD.
        settings: the K-FAC options.
        comm: this rank's counted messages (None: one process).
    """

    def __init__(
        self,
        params: Iterable[Any],
        model: nn.Module,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        settings: KFACSettings | None = None,
        comm: Comm | None = None,
    ) -> None:
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.preconditioner = KFACPreconditioner(model, settings or KFACSettings(), comm)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Collective: precondition (K-FAC), then one SGD step; returns the closure's loss if any."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.preconditioner.step(self.param_groups[0]["lr"])
        super().step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "kfac": self.preconditioner.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        kfac = state.pop("kfac")
        super().load_state_dict(state)
        self.preconditioner.load_state_dict(kfac)
