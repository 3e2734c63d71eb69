"""--lr-schedule cosine: nanoGPT's warm-up and cosine decay, carried through a checkpoint."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from deepjimu.options import GradientOptions
from deepjimu.strategies.schedule import attach_schedule, cosine_factor


def _optimizer(cfg: GradientOptions) -> torch.optim.Optimizer:
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))], lr=cfg.lr or 0.0)
    attach_schedule(opt, cfg, total=20)
    return opt


def _rates(opt: torch.optim.Optimizer, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.param_groups[0]["params"][0].grad = torch.ones(3)
        opt.step()
    return out


def test_the_rate_warms_up_decays_to_the_floor_and_resumes_where_it_stopped() -> None:
    cfg = GradientOptions(lr=1e-3, lr_schedule="cosine", warmup_steps=4, min_lr=1e-4)
    rates = _rates(_optimizer(cfg), 24)
    # nanoGPT's get_lr: (it + 1) / warmup of the peak, then half a cosine to min_lr at the
    # run's last step, min_lr after
    assert rates[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    middle = 1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi * 8 / 16))
    assert rates[12] == pytest.approx(middle)
    assert rates[20:] == pytest.approx([1e-4] * 4)
    assert all(a >= b for a, b in itertools.pairwise(rates[4:]))
    # the step lives in the optimizer's state: a resumed optimizer goes on at the same rates
    first = _optimizer(cfg)
    _rates(first, 9)
    resumed = _optimizer(cfg)
    resumed.load_state_dict(first.state_dict())
    assert _rates(resumed, 15) == pytest.approx(rates[9:])


def test_a_constant_rate_is_left_alone_and_the_floor_defaults_to_a_tenth() -> None:
    assert _rates(_optimizer(GradientOptions(lr=0.01)), 3) == [0.01] * 3
    assert cosine_factor(100, 0, 50, 0.1) == 0.1
    cfg = GradientOptions(lr=0.01, lr_schedule="cosine")
    assert _rates(_optimizer(cfg), 22)[-1] == pytest.approx(0.001)
