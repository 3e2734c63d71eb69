"""--optimizer kfac end to end: one step against a dense computation, jimu train with local and ddp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from deepjimu.config import RunConfig
from deepjimu.kfac.optimizer import KFAC
from deepjimu.kfac.preconditioner import KFACSettings
from deepjimu.launch import train


def test_settings_defaults_are_the_run_options_defaults() -> None:
    assert KFACSettings.from_config(RunConfig()) == KFACSettings()


@pytest.mark.usefixtures("float64")
def test_first_step_moves_weights_by_the_clipped_dense_natural_gradient() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    gamma, lr, kl_clip = 0.1, 0.5, 1e-3
    settings = KFACSettings(damping=gamma, kl_clip=kl_clip)
    opt = KFAC(layer.parameters(), layer, lr=lr, momentum=0.9, settings=settings)
    before = torch.cat([layer.weight, layer.bias[:, None]], dim=1).detach().clone()
    s = layer(x)
    s.retain_grad()
    F.cross_entropy(s, y).backward()
    grad = torch.cat([layer.weight.grad, layer.bias.grad[:, None]], dim=1).clone()
    opt.step()
    after = torch.cat([layer.weight, layer.bias[:, None]], dim=1).detach()
    # dense: factors from the batch, (G + gI) (x) (A + gI) solve, then the KL bound
    a = torch.cat([x, torch.ones(10, 1)], dim=1)
    g = 10 * s.grad
    fisher = torch.kron(g.T @ g / 10 + gamma * torch.eye(2), a.T @ a / 10 + gamma * torch.eye(4))
    natural = torch.linalg.solve(fisher, grad.flatten())
    nu = min(1.0, (kl_clip / (lr**2 * float(natural @ grad.flatten()))) ** 0.5)
    assert nu < 1, "the bound is active in this example"
    assert torch.allclose(after, before - lr * nu * natural.view(2, 4), rtol=1e-10, atol=1e-12)


def test_kfac_trains_faster_per_epoch_than_sgd_on_digits(tmp_path: Path) -> None:
    common = {"strategy": "local", "model": "mlp:64x1", "epochs": 1, "quiet": True}
    common |= {"runs_dir": str(tmp_path), "lr": 0.05, "kfac_damping": 0.1}
    kfac = train(RunConfig(name="kfac", optimizer="kfac", **common))
    sgd = train(RunConfig(name="sgd", optimizer="sgd", **common))
    assert kfac is not None and sgd is not None
    assert kfac["test_acc"] > sgd["test_acc"] + 0.05, (kfac["test_acc"], sgd["test_acc"])


@pytest.mark.slow
def test_ddp_mem_opt_counts_factor_and_gradient_bytes(tmp_path: Path) -> None:
    cfg = RunConfig(
        strategy="ddp", workers=2, optimizer="kfac", kfac_grad_workers=0.5, model="mlp:16x1",
        epochs=1, quiet=True, runs_dir=str(tmp_path), name="mem",
    )  # fmt: skip
    summary = train(cfg)
    assert summary is not None
    steps = summary["steps"]
    dims = [(64 + 1, 16), (16 + 1, 10)]  # (n_a, n_g) of the two Linear layers, float32
    triangles = sum(a * (a + 1) // 2 + g * (g + 1) // 2 for a, g in dims)
    by_kind = summary["bytes_sent_by_kind"]
    assert by_kind["kfac_factors"] == 2 * steps * triangles * 4
    assert by_kind["kfac_gradients"] == steps * sum(a * g for a, g in dims) * 4
    assert "kfac_decompositions" not in by_kind
    events = [json.loads(x) for x in (tmp_path / "mem" / "events.jsonl").read_text().splitlines()]
    assert events[-1]["bytes_sent_by_kind"] == by_kind
    assert summary["bytes_sent"] > sum(by_kind.values())  # plus DDP's gradient all-reduce
