"""Distributed K-FAC: 2 gloo ranks (DDP, F = 1/2 and 1) equal one process; exact resume; bytes per kind."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from deepjimu.comm import Comm, CommStats
from deepjimu.kfac.optimizer import KFAC
from deepjimu.kfac.preconditioner import KFACSettings
from distributed import run_world

# every test here starts processes (workers, a CLI run) or trains whole runs
pytestmark = pytest.mark.slow

STEPS, BATCH = 6, 8
SETTINGS = {"damping": 0.05, "kl_clip": 0.01, "factor_decay": 0.8, "inv_every": 2}
# (n_a, n_g) of the three layers of _model: conv 1x3x3 + bias, 32 + bias -> 6, 6 + bias -> 3
DIMS = [(10, 2), (33, 6), (7, 3)]


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    f64 = {"dtype": torch.float64}  # explicit: the ranks do not share the test's default dtype
    return nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1, **f64),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32, 6, **f64),
        nn.ReLU(),
        nn.Linear(6, 3, **f64),
    )


def _data() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH, 1, 4, 4, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 3, (STEPS, BATCH), generator=gen)


def _train(net: nn.Module, opt: KFAC, steps: range, rows: slice) -> None:
    x, y = _data()
    for t in steps:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x[t, rows]), y[t, rows]).backward()
        opt.step()


def _optimizer(net: nn.Module, model: nn.Module, fraction: float, comm: Comm | None) -> KFAC:
    settings = KFACSettings(grad_workers=fraction, **SETTINGS)
    return KFAC(net.parameters(), model, lr=0.1, momentum=0.9, settings=settings, comm=comm)


def _params(model: nn.Module) -> list[Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _ranks(rank: int, world: int) -> dict[float, dict[str, Any]]:
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    out = {}
    for fraction in (1 / world, 1.0):
        model = _model()
        ddp = DistributedDataParallel(model)
        comm = Comm(CommStats())
        opt = _optimizer(ddp, model, fraction, comm)
        _train(ddp, opt, range(STEPS // 2), rows)
        saved = copy.deepcopy((model.state_dict(), opt.state_dict()))
        _train(ddp, opt, range(STEPS // 2, STEPS), rows)
        sent = dict(comm.stats.sent_by_kind)
        # resume from the half-way state into fresh objects, as a checkpoint does
        model2 = _model()
        model2.load_state_dict(saved[0])
        ddp2 = DistributedDataParallel(model2)
        opt2 = _optimizer(ddp2, model2, fraction, Comm(CommStats()))
        opt2.load_state_dict(saved[1])
        _train(ddp2, opt2, range(STEPS // 2, STEPS), rows)
        out[fraction] = {"params": _params(model), "resumed": _params(model2), "sent": sent}
    return out


def test_two_ranks_equal_one_process_for_mem_opt_and_comm_opt() -> None:
    model = _model()
    opt = _optimizer(model, model, 1.0, None)
    _train(model, opt, range(STEPS), slice(None))
    reference = _params(model)
    assert not torch.equal(reference[0], _params(_model())[0])
    ranks = run_world(_ranks, 2)
    for fraction in (0.5, 1.0):
        for a, b in zip(ranks[0][fraction]["params"], ranks[1][fraction]["params"], strict=True):
            assert torch.equal(a, b), "the replicas drifted apart"
        for r in ranks:
            for got, want, resumed in zip(
                r[fraction]["params"], reference, r[fraction]["resumed"], strict=True
            ):
                assert torch.allclose(got, want, rtol=1e-9, atol=1e-12), fraction
                assert torch.equal(resumed, got), fraction
    # bytes as sent, summed over ranks: factor triangles all-reduced every step by each rank
    sent = {f: {k: sum(r[f]["sent"].get(k, 0) for r in ranks) for k in ("kfac_factors", "kfac_decompositions", "kfac_gradients")} for f in (0.5, 1.0)}  # fmt: skip
    triangles = sum(a * (a + 1) // 2 + g * (g + 1) // 2 for a, g in DIMS)
    for f in (0.5, 1.0):
        assert sent[f]["kfac_factors"] == 2 * STEPS * triangles * 8
    # MEM-OPT: each layer's preconditioned gradient leaves its one owner every step
    assert sent[0.5]["kfac_gradients"] == STEPS * sum(a * g for a, g in DIMS) * 8
    assert sent[0.5]["kfac_decompositions"] == 0
    # COMM-OPT: each eigendecomposition leaves its owner at every inverse update (steps 0, 2, 4)
    eigen = sum(a * a + a + g * g + g for a, g in DIMS)
    assert sent[1.0]["kfac_decompositions"] == STEPS // SETTINGS["inv_every"] * eigen * 8
    assert sent[1.0]["kfac_gradients"] == 0
