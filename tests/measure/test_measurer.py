"""ThisMachine: what a strategy asks its run to measure, measured without touching the run."""

from __future__ import annotations

import torch
from torch import nn

from deepjimu.balance import partition
from deepjimu.measure.measurer import ThisMachine


def test_block_costs_leave_model_and_rng_alone() -> None:
    model = nn.Sequential(
        nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 512), nn.Linear(512, 8)), nn.Linear(8, 8)
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(3)
    expected_draw = torch.rand(1)
    torch.manual_seed(3)
    costs = ThisMachine().block_costs(model, torch.randn(64, 8, generator=torch.Generator()))
    assert len(costs) == 3 and all(c > 0 for c in costs)
    assert partition(costs, 3) == [1, 1, 1]
    assert torch.rand(1) == expected_draw
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
