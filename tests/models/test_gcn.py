"""The GCN model: spec, Kipf & Welling's forward against a dense formula, dropout only in training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepjimu.data.graph import normalized_adjacency, undirected_edges
from deepjimu.errors import JimuError
from deepjimu.models import build_model, count_blocks, parse_spec
from deepjimu.models.gcn import GCN


def test_spec() -> None:
    assert parse_spec("gcn").widths == (16,) and parse_spec("gcn:32").widths == (32,)
    assert parse_spec("gcn").needs_graph and not parse_spec("mlp:8x1").needs_graph
    assert count_blocks("gcn:4") == 2
    for bad in ("gcn:0", "gcn:x", "gcn:4x2"):
        with pytest.raises(JimuError, match="gcn"):
            parse_spec(bad)
    with pytest.raises(JimuError, match=r"needs node feature rows; the data has shape \(1, 8, 8\)"):
        build_model("gcn", (1, 8, 8), 10)


def _graph() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(12, (30,), generator=g), torch.randint(12, (30,), generator=g)
    adj = normalized_adjacency(undirected_edges(src, dst, 12), 12)
    return torch.rand(12, 5, generator=g), adj


def test_forward_is_kipf_welling() -> None:
    x, adj = _graph()
    model = build_model("gcn:4", (5,), 3, seed=1)
    assert isinstance(model, GCN) and len(model) == 2
    model.eval()
    (w0, b0), (w1, b1) = ((b.linear.weight, b.linear.bias) for b in model)
    a = adj.to_dense()
    want = a @ torch.relu(a @ x @ w0.T + b0) @ w1.T + b1
    with torch.no_grad():
        np.testing.assert_allclose(model(x, adj).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
        # Glorot weights, zero biases, as the paper's code
        assert float(b0.abs().sum()) == 0 and float(w0.abs().max()) <= (6 / (5 + 4)) ** 0.5


def test_dropout_only_in_training() -> None:
    x, adj = _graph()
    model = build_model("gcn", (5,), 3)
    model.train()
    assert not torch.equal(model(x, adj), model(x, adj))
    model.eval()
    assert torch.equal(model(x, adj), model(x, adj))


def test_trains_under_bf16_autocast() -> None:
    """--precision bf16: the dense products drop to bfloat16, the sparse ones stay float32."""
    x, adj = _graph()
    model = build_model("gcn", (5,), 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x, adj), torch.zeros(12, dtype=torch.long))
    loss.backward()
    assert torch.isfinite(loss) and float(model[0].linear.weight.grad.abs().sum()) > 0
