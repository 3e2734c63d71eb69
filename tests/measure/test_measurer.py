"""ThisMachine: what a strategy asks its run to measure, measured without touching the run."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from deepjimu.balance import partition
from deepjimu.measure.blocks import layers_of
from deepjimu.measure.measurer import ThisMachine
from deepjimu.models import build_model


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


def test_a_real_models_flops_count_its_attention_as_its_shapes_do() -> None:
    """On the CPU torch's counter misses the attention kernel; layers_of counts it as the
    meta device's count does (the planner sizes other devices from these FLOPs)."""
    x = torch.randint(0, 65, (1, 32))
    real = layers_of(build_model("gpt:2x64:4", (32,), 65, seed=0), x)
    with torch.device("meta"):
        shapes = layers_of(build_model("gpt:2x64:4", (32,), 65, seed=0), x)
    assert [b.fwd_flops for b in real] == [b.fwd_flops for b in shapes]
    plain = nn.Sequential(*build_model("gpt:2x64:4", (32,), 65, seed=0))
    with FlopCounterMode(display=False) as without:  # what torch alone counts here
        plain(x)
    assert sum(b.fwd_flops for b in real) > without.get_total_flops()
