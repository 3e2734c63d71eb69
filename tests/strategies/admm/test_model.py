"""layer_blocks: any model's leaves as admm's blocks, one linear map each, the modules shared."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deepjimu.models import build_model
from deepjimu.strategies.admm.layers import layer_ops
from deepjimu.strategies.admm.model import layer_blocks


@pytest.mark.parametrize(("spec", "shape"), [("mlp:8x2", (1, 4, 4)), ("cnn:2-3", (1, 8, 8))])
def test_the_blocks_of_a_spec_model_are_its_own_children(spec: str, shape: tuple) -> None:
    model = build_model(spec, shape, 3)
    blocks = layer_blocks(model)
    assert len(blocks) == len(model)
    for ours, theirs in zip(blocks, model, strict=True):
        assert list(ours) == list(theirs)  # the very modules, in order


def test_a_flat_mlp_becomes_blocks_that_share_its_modules() -> None:
    relu = nn.ReLU()  # one module used twice, as a user may write it
    model = nn.Sequential(
        nn.Flatten(),
        nn.Sequential(nn.Linear(16, 8), relu, nn.Linear(8, 8)),
        relu,
        nn.Linear(8, 3),
    )
    keys = list(model.state_dict())
    blocks = layer_blocks(model)
    assert [[type(m).__name__ for m in b] for b in blocks] == [
        ["Flatten", "Linear", "ReLU"],
        ["Linear", "ReLU"],
        ["Linear"],
    ]
    assert [type(op).__name__ for op in layer_ops(blocks, (1, 4, 4))] == ["DenseOp"] * 3
    x = torch.randn(5, 1, 4, 4)
    assert torch.equal(blocks(x), model(x))
    with torch.no_grad():
        blocks[2][0].weight.zero_()  # training the blocks trains the model
    assert torch.equal(model[3].weight, torch.zeros(3, 8))
    assert list(model.state_dict()) == keys  # the model keeps its own keys
