"""``embed:VOCAB:DIM``: parsed, built, refusing ids outside its vocabulary, trained by every optimizer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.models import build_model, count_blocks, parse_spec
from deepjimu.strategies.base import make_optimizer


def test_embed_spec_builds_a_sparse_mean_bag_and_a_linear() -> None:
    assert parse_spec("embed:1000:16").widths == (1000, 16)
    assert count_blocks("embed:1000:16") == 2
    model = build_model("embed:1000:16", (8,), 5)
    bag, head = model
    assert isinstance(bag, nn.EmbeddingBag) and bag.sparse and bag.mode == "mean"
    assert isinstance(head, nn.Linear) and (head.in_features, head.out_features) == (16, 5)
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 4.0, 999.0]])
    assert model(x).shape == (2, 5)


def test_embed_spec_with_a_head_of_hidden_layers() -> None:
    assert parse_spec("embed:1000:16:64x2").widths == (1000, 16, 64, 64)
    assert parse_spec("embed:1000:16:32-8").widths == (1000, 16, 32, 8)
    assert count_blocks("embed:1000:16:32-8") == 4
    model = build_model("embed:1000:16:32-8", (8,), 5)
    hidden = [(b[0].in_features, b[0].out_features) for b in list(model)[1:-1]]
    assert hidden == [(16, 32), (32, 8)] and all(isinstance(b[1], nn.ReLU) for b in model[1:-1])
    assert (model[-1].in_features, model[-1].out_features) == (8, 5)
    assert model(torch.tensor([[1.0, 2.0], [3.0, 999.0]])).shape == (2, 5)


@pytest.mark.parametrize(
    "spec", ["embed:0:4", "embed:10", "embed:10:4:0", "embed:10:4:2x", "embed:10:4:8-0"]
)
def test_bad_embed_specs_are_refused(spec: str) -> None:
    with pytest.raises(JimuError, match="embed"):
        parse_spec(spec)


def test_ids_outside_the_vocabulary_end_in_one_line() -> None:
    model = build_model("embed:10:4", (3,), 2)
    with pytest.raises(JimuError, match=r"token ids must be in 0..9 .*\(ids: 0..12\)"):
        model(torch.tensor([[0.0, 12.0, 3.0]]))
    with pytest.raises(JimuError, match="one bag of token ids per sample"):
        build_model("embed:10:4", (1, 8, 8), 2)


@pytest.mark.parametrize(
    "optimizer, momentum, wd", [("adam", 0, 0), ("sgd", 0.9, 0), ("sgd", 0, 0.01), ("kfac", 0.9, 0)]
)
def test_every_optimizer_steps_on_its_sparse_gradient(
    optimizer: str, momentum: float, wd: float
) -> None:
    model = build_model("embed:50:4", (6,), 3)
    cfg = RunConfig(optimizer=optimizer, lr=0.1, momentum=momentum, weight_decay=wd)
    opt = make_optimizer(model.parameters(), cfg, model)
    before = model[0].weight.detach().clone()
    x = torch.randint(0, 50, (8, 6)).float()
    F.cross_entropy(model(x), torch.randint(0, 3, (8,))).backward()
    assert model[0].weight.grad.is_sparse
    opt.step()
    assert not torch.equal(before, model[0].weight)
    if momentum:  # made dense before the step: the momentum buffer stays dense and bounded
        assert not opt.state[model[0].weight]["momentum_buffer"].is_sparse


def test_plain_sgd_keeps_the_gradient_sparse() -> None:
    model = build_model("embed:50:4", (6,), 3)
    cfg = RunConfig(optimizer="sgd", lr=0.1, momentum=0.0)
    opt = make_optimizer(model.parameters(), cfg, model)
    F.cross_entropy(model(torch.zeros(2, 6)), torch.zeros(2, dtype=torch.long)).backward()
    opt.step()
    assert model[0].weight.grad.is_sparse
    assert torch.equal(model[0].weight[1:], build_model("embed:50:4", (6,), 3)[0].weight[1:])
