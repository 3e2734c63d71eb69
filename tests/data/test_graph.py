"""Graph features against dense computations, and the stochastic block model's shape and balance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data.graph import hop_features, normalized_adjacency, undirected_edges
from deepjimu.data.sbm import P_OTHER, P_TOPIC, load_sbm

# a 5-node graph: a triangle 0-1-2, a tail 2-3, node 4 alone
LINKS = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 2), (1, 1)]


def _dense_a_hat() -> np.ndarray:
    a = np.zeros((5, 5))
    for i, j in LINKS:
        if i != j:
            a[i, j] = a[j, i] = 1.0
    a += np.eye(5)
    d = np.diag(1 / np.sqrt(a.sum(1)))
    return d @ a @ d


def _edges() -> torch.Tensor:
    src, dst = (torch.tensor(v) for v in zip(*LINKS, strict=True))
    return undirected_edges(src, dst, 5)


def test_undirected_edges() -> None:
    pairs = sorted(map(tuple, _edges().T.tolist()))
    assert pairs == sorted([(0, 1), (1, 0), (1, 2), (2, 1), (0, 2), (2, 0), (2, 3), (3, 2)])


def test_a_hat_matches_dense() -> None:
    adj = normalized_adjacency(_edges(), 5)
    assert adj.layout == torch.sparse_csr and adj.values().numel() == 8 + 5
    np.testing.assert_allclose(adj.to_dense().numpy(), _dense_a_hat(), rtol=1e-6)
    # the isolated node keeps only its self loop: A_hat[4, 4] = 1
    assert float(adj.to_dense()[4, 4]) == 1.0


@pytest.mark.parametrize("mode", ["concat", "last"])
def test_hop_features_match_dense_powers(mode: str) -> None:
    x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    adj = normalized_adjacency(_edges(), 5).to(torch.float64)  # A_hat is built in float32
    a = _dense_a_hat()
    powers = [np.linalg.matrix_power(a, k) @ x.numpy() for k in range(4)]
    want = np.concatenate(powers, 1) if mode == "concat" else powers[3]
    every, some = torch.arange(5), torch.tensor([4, 1])
    got_all, got_some = hop_features(adj, x, 3, mode, [every, some])
    np.testing.assert_allclose(got_all.numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(got_some.numpy(), want[[4, 1]], rtol=1e-5)
    np.testing.assert_allclose(hop_features(adj, x, 0, mode, [every])[0].numpy(), x.numpy())


def _sbm(**kw: object) -> DataOptions:
    base: dict[str, object] = {
        "synthetic_n": 3000,
        "synthetic_features": 30,
        "synthetic_classes": 3,
        "sbm_degree": 8.0,
        "sbm_homophily": 0.9,
    }
    return DataOptions(**{**base, **kw})  # type: ignore[arg-type]


def test_sbm_shapes_balance_and_homophily() -> None:
    g = load_sbm(_sbm())
    assert g.x.shape == (3000, 30) and g.edges.shape[0] == 2
    assert torch.bincount(g.y).tolist() == [1000, 1000, 1000]
    # about N d / 2 undirected edges (a few repeats merged), none a self loop
    assert 0.97 * 12000 <= g.edges.shape[1] / 2 <= 12000
    assert bool((g.edges[0] != g.edges[1]).all())
    same = (g.y[g.edges[0]] == g.y[g.edges[1]]).float().mean()
    assert abs(float(same) - 0.9) < 0.02
    # features: a node uses its own topic's words about twice as often
    topic = torch.arange(30) % 3 == g.y[:, None]
    assert abs(float(g.x[topic].mean()) - P_TOPIC) < 0.01
    assert abs(float(g.x[~topic].mean()) - P_OTHER) < 0.01
    # split: 20% test, val_fraction of the rest, disjoint, every node somewhere
    parts = [g.train_idx, g.val_idx, g.test_idx]
    assert [len(p) for p in parts] == [2160, 240, 600]
    assert torch.cat(parts).sort().values.tolist() == list(range(3000))


def test_sbm_is_seeded_and_odd_sizes_stay_balanced() -> None:
    a, b = load_sbm(_sbm(seed=1)), load_sbm(_sbm(seed=1))
    assert torch.equal(a.edges, b.edges) and torch.equal(a.x, b.x)
    assert not torch.equal(a.edges, load_sbm(_sbm(seed=2)).edges)
    counts = torch.bincount(load_sbm(_sbm(synthetic_n=1001, synthetic_classes=4)).y)
    assert int(counts.max() - counts.min()) <= 1


def test_graph_features_help_on_sbm() -> None:
    """The propagated rows carry the class better than the raw features (nearest class mean)."""

    def mean_rule_acc(hops: int) -> float:
        d = load_dataset("sbm", _sbm(graph_hops=hops))
        means = torch.stack([d.train_x[d.train_y == c].mean(0) for c in range(3)])
        return float((torch.cdist(d.test_x, means).argmin(1) == d.test_y).float().mean())

    raw, propagated = mean_rule_acc(0), mean_rule_acc(2)
    assert propagated > raw + 0.1, (raw, propagated)
