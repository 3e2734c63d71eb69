"""The public pdADMM reference's per-iteration computation, re-implemented as a benchmark baseline.

This module exists only as the reference side of ``benchmarks/admm_speed.py``; deepjimu never
imports it. It mirrors the PyTorch update functions of github xianggebenben/pdADMM-G
(``pdADMM_G_serial/common.py``, the same functions as ``pdADMM_G_parallel/common.py``) and the
update order of its serial driver (``pdADMM_G_serial/pdADMM_G_5_layer.py``), on a plain MLP
with ReLU, float32, one number rho for both rho and nu (as the reference does). It was written
from a reading of that code, not copied; it does the same tensor work:

- layout features x samples: W_l [n_l, n_{l-1}], b_l [n_l, 1], p_l [n_{l-1}, N].
- p-step (l >= 2): phi(p) = rho/2 ||z - W p - b||^2 + <u + rho/2 (p - q), p - q>; its gradient
  by autograd (one forward and one backward GEMM), then backtracking: t = 20, doubled while
  phi(p - g/t) exceeds the quadratic model f + <g, d> + t/2 ||d||^2; after 10 doublings
  the step is abandoned (p unchanged). One GEMM per trial.
- W-step: rho/2 ||z - W p - b||^2 + mu/2 ||W||^2; gradient by autograd (forward and backward
  GEMM), then the same backtracking from alpha = 20.
- b-step: b - mean(rho (W p + b - z)) / rho with the new W (one GEMM).
- z-step (l < L): z1 = min((W p + b + z)/2, 0), z2 = max((W p + b + z + q)/3, 0), keep the
  one with the lower elementwise objective; W p is recomputed for z1 and for each objective
  (three GEMMs).
- z_L-step: FISTA with step 1/eta, eta = 4, up to 50 steps, stopping when the objective
  changes by less than 1e-3; W p is recomputed twice per step.
- q = (p_{l+1} + u/rho + relu(z)) / 2 and u = u + rho (p_{l+1} - q).

Every layer takes its p-step, then every layer its W-step, then b, z, q, u, as the serial
driver does. The reference tracks autograd through all later operations (its p and W are
Variables with ``requires_grad``); here only the gradients are taken with autograd and the
rest runs without graph recording, which does the same arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ReferenceState", "init_reference", "reference_iteration"]

_MAX_DOUBLINGS = 10
_FIRST_STEP = 20.0
_FISTA_STEPS = 50
_FISTA_ETA = 4.0
_FISTA_TOL = 1e-3


@dataclass
class ReferenceState:
    """Variables of the reference's Problem 2 in its features x samples layout.

    ``p[0]`` is the data x^T and is never updated; ``q``, ``u`` have L-1 entries. ``trials``
    counts, for the last iteration, the objective evaluations of the p and W line searches
    (one GEMM each) and the FISTA steps of z_L.
    """

    W: list[Tensor]
    b: list[Tensor]
    p: list[Tensor]
    z: list[Tensor]
    q: list[Tensor]
    u: list[Tensor]
    trials: dict[str, int] = field(default_factory=dict)


def init_reference(x: Tensor, W: list[Tensor], b: list[Tensor]) -> ReferenceState:
    """Forward-pass initialisation from the data x [N, n_0] and weights W_l [n_l, n_{l-1}], b_l [n_l].

    z_l = W_l p_l + b_l, q_l = p_{l+1} = relu(z_l), u_l = 0 (the reference's own start, but with
    the given weights so both sides of the benchmark start from the same network).
    """
    p = [x.T.contiguous()]
    Ws = [w.detach().clone() for w in W]
    bs = [v.detach().reshape(-1, 1).clone() for v in b]
    z: list[Tensor] = []
    q: list[Tensor] = []
    for l, (w, v) in enumerate(zip(Ws, bs, strict=True)):
        z.append(w @ p[l] + v)
        if l < len(Ws) - 1:
            q.append(torch.relu(z[l]))
            p.append(q[l].clone())
    u = [torch.zeros_like(t) for t in q]
    return ReferenceState(Ws, bs, p, z, q, u)


def _backtrack(
    objective: Callable[[Tensor], Tensor], x: Tensor, grad: Tensor, f0: Tensor
) -> tuple[Tensor, int]:
    """x - grad/t for the first t = 20 * 2^k (k <= 10) whose quadratic model bounds the objective.

    Returns the new x (x itself if no t qualifies) and the number of objective evaluations.
    """
    t = _FIRST_STEP
    for k in range(_MAX_DOUBLINGS + 1):
        x_new = x - grad / t
        d = x_new - x
        if bool(objective(x_new) <= f0 + torch.sum((t / 2 * d + grad) * d)):
            return x_new, k + 1
        t *= 2
    return x, _MAX_DOUBLINGS + 1


def _fit(p: Tensor, W: Tensor, b: Tensor, z: Tensor, rho: float, mu: float) -> Tensor:
    r = z - W @ p - b
    return rho / 2 * torch.sum(r * r) + mu / 2 * torch.sum(W * W)


def _p_objective(p: Tensor, q: Tensor, W: Tensor, b: Tensor, z: Tensor, u: Tensor, rho: float):
    d = p - q
    return rho / 2 * torch.sum((z - W @ p - b) ** 2) + torch.sum((u + rho / 2 * d) * d)


def _update_p(
    p: Tensor, q: Tensor, W: Tensor, b: Tensor, z: Tensor, u: Tensor, rho: float
) -> tuple[Tensor, int]:
    with torch.enable_grad():
        leaf = p.detach().requires_grad_(True)
        f = _p_objective(leaf, q, W, b, z, u, rho)
        (grad,) = torch.autograd.grad(f, [leaf])
    return _backtrack(lambda v: _p_objective(v, q, W, b, z, u, rho), p, grad, f.detach())


def _update_W(
    p: Tensor, b: Tensor, z: Tensor, W: Tensor, rho: float, mu: float
) -> tuple[Tensor, int]:
    with torch.enable_grad():
        leaf = W.detach().requires_grad_(True)
        f = _fit(p, leaf, b, z, rho, mu)
        (grad,) = torch.autograd.grad(f, [leaf])
    return _backtrack(lambda v: _fit(p, v, b, z, rho, mu), W, grad, f.detach())


def _update_b(p: Tensor, W: Tensor, z: Tensor, b: Tensor, rho: float) -> Tensor:
    grad = torch.mean(rho * (W @ p + b - z), dim=1).reshape(-1, 1)
    return b - grad / rho


def _z_objective(p: Tensor, W: Tensor, b: Tensor, z: Tensor, q: Tensor, rho: float) -> Tensor:
    return rho / 2 * (z - W @ p - b) ** 2 + rho / 2 * (q - torch.relu(z)) ** 2


def _update_z(z: Tensor, p: Tensor, W: Tensor, b: Tensor, q: Tensor, rho: float) -> Tensor:
    z1 = (W @ p + b + z) / 2
    z2 = (2 * z1 + q) / 3
    z1 = torch.minimum(z1, torch.zeros_like(z1))
    z2 = torch.maximum(z2, torch.zeros_like(z2))
    worse1 = _z_objective(p, W, b, z1, q, rho) > _z_objective(p, W, b, z2, q, rho)
    return torch.where(worse1, z2, z1)


def _softmax_classes(z: Tensor) -> Tensor:
    e = torch.exp(z)
    e = torch.where(torch.isinf(e), torch.full_like(e, math.exp(88.6)), e)
    return e / (torch.sum(e, dim=0) + 1e-10)


def _cross_entropy(onehot: Tensor, z: Tensor) -> Tensor:
    return -torch.sum(onehot * torch.log(_softmax_classes(z) + 1e-10))


def _update_z_last(
    p: Tensor, W: Tensor, b: Tensor, onehot: Tensor, z: Tensor, rho: float
) -> tuple[Tensor, int]:
    f = 1e11
    lam = 1.0
    zeta = z
    for step in range(_FISTA_STEPS):
        f_old = f
        f = float(_cross_entropy(onehot, z) + rho / 2 * torch.sum((z - W @ p - b) ** 2))
        if abs(f - f_old) < _FISTA_TOL:
            return z, step
        lam_old = lam
        lam = (1 + math.sqrt(1 + 4 * lam * lam)) / 2
        gamma = (1 - lam_old) / lam
        grad = _softmax_classes(z) - onehot
        zeta_old = zeta
        zeta = (rho * (W @ p + b) + (z - _FISTA_ETA * grad) / _FISTA_ETA) / (rho + 1 / _FISTA_ETA)
        z = (1 - gamma) * zeta + gamma * zeta_old
    return z, _FISTA_STEPS


@torch.no_grad()
def reference_iteration(s: ReferenceState, onehot: Tensor, rho: float, mu: float = 0.0) -> None:
    """One iteration of the reference's serial driver, in place on ``s``.

    Args:
        s: the state from :func:`init_reference`.
        onehot: labels as a one-hot [C, N] float tensor.
        rho: the reference's single penalty (rho = nu).
        mu: the ridge weight of its W-step (0: the pdADMM paper's problem).
    """
    L = len(s.W)
    s.trials = {"p": 0, "W": 0, "fista": 0}
    for l in range(1, L):
        s.p[l], n = _update_p(s.p[l], s.q[l - 1], s.W[l], s.b[l], s.z[l], s.u[l - 1], rho)
        s.trials["p"] += n
    for l in range(L):
        s.W[l], n = _update_W(s.p[l], s.b[l], s.z[l], s.W[l], rho, mu)
        s.trials["W"] += n
    for l in range(L):
        s.b[l] = _update_b(s.p[l], s.W[l], s.z[l], s.b[l], rho)
    for l in range(L - 1):
        s.z[l] = _update_z(s.z[l], s.p[l], s.W[l], s.b[l], s.q[l], rho)
    s.z[L - 1], s.trials["fista"] = _update_z_last(
        s.p[L - 1], s.W[L - 1], s.b[L - 1], onehot, s.z[L - 1], rho
    )
    for l in range(L - 1):
        s.q[l] = (s.p[l + 1] + s.u[l] / rho + F.relu(s.z[l])) / 2
    for l in range(L - 1):
        s.u[l] = s.u[l] + rho * (s.p[l + 1] - s.q[l])
