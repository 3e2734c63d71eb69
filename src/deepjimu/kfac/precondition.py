"""K-FAC preconditioning of one layer's gradient (eigen or inverse form) and KL clipping.

Damping convention: each factor is damped on its own (factored Tikhonov damping),

    grad' = (G + gamma I)^-1 grad (A + gamma I)^-1,

where ``grad`` is the layer's (out, in + bias) gradient matrix ``[dW | db]``. The inverse
form computes exactly this; the eigen form computes the same matrix from A = Qa diag(da)
Qa^T and G = Qg diag(dg) Qg^T as Qg [(Qg^T grad Qa) / ((dg + gamma)(da + gamma)^T)] Qa^T,
so the two forms agree (kfac-pytorch's eigen form instead divides by dg da^T + gamma,
which damps the Kronecker product once and differs from its own inverse form). Because
that divisor is an outer product, the eigen form equals (Qg diag(1/(dg + gamma)) Qg^T)
grad (Qa diag(1/(da + gamma)) Qa^T): those two matrices are formed once per decomposition
and damping, and each step costs two products, as with the inverse form.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from deepjimu.choices import KfacMethod
from deepjimu.kfac.assignment import packed_numel
from deepjimu.kfac.factors import triu_pack, triu_unpack

__all__ = ["METHODS", "Decomposition", "Eigen", "Inverse", "decompose", "kl_clip_scale"]


@dataclass
class Decomposition(ABC):
    """What a layer's gradient is preconditioned with, computed from its factors A and G.

    Subclasses say how to precondition and how to pack themselves into one flat vector
    (what is broadcast to the other gradient workers) and back.
    """

    method: ClassVar[str]

    @abstractmethod
    def precondition(self, grad: Tensor, damping: float) -> Tensor:
        """(G + damping I)^-1 grad (A + damping I)^-1 for the (out, in) matrix ``grad``."""

    @abstractmethod
    def pack(self) -> Tensor:
        """All tensors as one flat vector."""

    @classmethod
    @abstractmethod
    def numel(cls, n_a: int, n_g: int) -> int:
        """Length of :meth:`pack`'s vector for factors of sizes ``n_a`` and ``n_g``."""

    @classmethod
    @abstractmethod
    def unpack(cls, flat: Tensor, n_a: int, n_g: int) -> Decomposition:
        """The inverse of :meth:`pack`."""


@dataclass
class Eigen(Decomposition):
    """A = qa diag(da) qa^T, G = qg diag(dg) qg^T (eigenvalues clamped at 0); damping at use."""

    qa: Tensor
    da: Tensor
    qg: Tensor
    dg: Tensor
    method: ClassVar[KfacMethod] = KfacMethod.EIGEN
    # the damped inverses of the last damping used (see the module docstring)
    _damped: tuple[float, Tensor, Tensor] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, a: Tensor, g: Tensor) -> Eigen:
        da, qa = torch.linalg.eigh(a)
        dg, qg = torch.linalg.eigh(g)
        # factors are positive semi-definite; rounding can make tiny eigenvalues negative.
        # eigh returns column-major eigenvectors: row-major copies make the products, and so
        # the preconditioned gradients, bitwise the same as from a received (unpacked) copy
        return cls(qa.contiguous(), da.clamp(min=0), qg.contiguous(), dg.clamp(min=0))

    def precondition(self, grad: Tensor, damping: float) -> Tensor:
        if self._damped is None or self._damped[0] != damping:
            a_inv = (self.qa / (self.da + damping)) @ self.qa.T
            g_inv = (self.qg / (self.dg + damping)) @ self.qg.T
            self._damped = (damping, a_inv, g_inv)
        _, a_inv, g_inv = self._damped
        return g_inv @ grad @ a_inv

    def pack(self) -> Tensor:
        return torch.cat([self.qa.flatten(), self.da, self.qg.flatten(), self.dg])

    @classmethod
    def numel(cls, n_a: int, n_g: int) -> int:
        return packed_numel(KfacMethod.EIGEN, n_a, n_g)

    @classmethod
    def unpack(cls, flat: Tensor, n_a: int, n_g: int) -> Eigen:
        qa, da, qg, dg = flat.split([n_a * n_a, n_a, n_g * n_g, n_g])
        return cls(qa.view(n_a, n_a), da, qg.view(n_g, n_g), dg)


@dataclass
class Inverse(Decomposition):
    """(A + gamma I)^-1 and (G + gamma I)^-1: damping fixed when they are computed.

    Both are symmetric, so only their upper triangles are packed.
    """

    a_inv: Tensor
    g_inv: Tensor
    method: ClassVar[KfacMethod] = KfacMethod.INVERSE

    @classmethod
    def of(cls, a: Tensor, g: Tensor, damping: float) -> Inverse:
        return cls(_damped_inverse(a, damping), _damped_inverse(g, damping))

    def precondition(self, grad: Tensor, damping: float) -> Tensor:
        return self.g_inv @ grad @ self.a_inv

    def pack(self) -> Tensor:
        return torch.cat([triu_pack(self.a_inv), triu_pack(self.g_inv)])

    @classmethod
    def numel(cls, n_a: int, n_g: int) -> int:
        return packed_numel(KfacMethod.INVERSE, n_a, n_g)

    @classmethod
    def unpack(cls, flat: Tensor, n_a: int, n_g: int) -> Inverse:
        a, g = flat.split([n_a * (n_a + 1) // 2, n_g * (n_g + 1) // 2])
        return cls(triu_unpack(a, n_a), triu_unpack(g, n_g))


def _damped_inverse(m: Tensor, damping: float) -> Tensor:
    """(m + damping I)^-1 of a positive semi-definite m, by Cholesky (symmetric by construction)."""
    eye = torch.eye(m.shape[0], dtype=m.dtype, device=m.device)
    return torch.cholesky_inverse(torch.linalg.cholesky(m + damping * eye))


METHODS: dict[KfacMethod, type[Decomposition]] = {
    KfacMethod.EIGEN: Eigen,
    KfacMethod.INVERSE: Inverse,
}


def decompose(method: KfacMethod, a: Tensor, g: Tensor, damping: float) -> Decomposition:
    """The decomposition ``method`` (``eigen`` or ``inverse``) of the factors A and G.

    Example:
        >>> d = decompose(KfacMethod.EIGEN, torch.eye(3), torch.eye(2), 1.0)
        >>> d.precondition(torch.ones(2, 3), 1.0)
        tensor([[0.2500, 0.2500, 0.2500],
                [0.2500, 0.2500, 0.2500]])
    """
    if method == KfacMethod.EIGEN:
        return Eigen.of(a, g)
    return Inverse.of(a, g, damping)


def kl_clip_scale(pairs: list[tuple[Tensor, Tensor]], lr: float, kl_clip: float) -> float:
    """The factor nu that bounds the step's quadratic KL estimate by ``kl_clip`` (KAISA).

    With the step Delta = lr nu grad' (grad' the preconditioned gradient F^-1 grad, F the
    damped Kronecker Fisher), Delta^T F Delta = nu^2 lr^2 sum grad'.grad; so
    nu = min(1, sqrt(kl_clip / |lr^2 sum grad'.grad|)) keeps it <= kl_clip.

    Args:
        pairs: (preconditioned gradient, gradient) of each layer.
        lr: the learning rate of the step.
        kl_clip: the bound; 0 disables clipping.

    Returns:
        nu in (0, 1].
    """
    if kl_clip == 0 or not pairs:
        return 1.0
    vg = abs(sum(float((p * g).sum()) for p, g in pairs)) * lr**2
    return min(1.0, math.sqrt(kl_clip / vg)) if vg > 0 else 1.0
