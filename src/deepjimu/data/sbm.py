"""``sbm``: a stochastic block model graph of any size with class-correlated features, no files."""

from __future__ import annotations

import torch
from torch import Tensor

from deepjimu.data.base import DataOptions
from deepjimu.data.graph import Graph, register_graph_dataset, undirected_edges

__all__ = ["TEST_FRACTION", "block_edges", "load_sbm", "topic_features"]

TEST_FRACTION = 0.2
# each feature is a word of one class's topic (feature j: class j mod C); a node uses each
# word of its own topic with probability P_TOPIC and any other word with P_OTHER, so its
# features say its class only weakly and its neighbours' features help
P_TOPIC, P_OTHER = 0.1, 0.05
_CHUNK = 1 << 16


@register_graph_dataset("sbm")
def load_sbm(opts: DataOptions) -> Graph:
    """A planted-partition stochastic block model with ``synthetic_n`` nodes.

    ``synthetic_classes`` balanced classes (sizes differ by at most one); about
    ``synthetic_n * sbm_degree / 2`` undirected edges (average degree ``sbm_degree``), a
    fraction ``sbm_homophily`` of them inside a class (:func:`block_edges`); binary
    bag-of-words features of width ``synthetic_features`` (:func:`topic_features`). A
    seeded random 20% of the nodes test, ``val_fraction`` of the rest validate, the
    others train. Memory is linear in nodes and edges: 1,000,000 nodes with 10,000,000
    edges fit a 24 GB machine (BENCHMARKS.md).
    """
    n, c = opts.synthetic_n, opts.synthetic_classes
    g = torch.Generator().manual_seed(opts.seed + 15485863)
    y = (torch.arange(n) % c)[torch.randperm(n, generator=g)]
    edges = block_edges(y, c, round(n * opts.sbm_degree / 2), opts.sbm_homophily, g)
    x = topic_features(y, c, opts.synthetic_features, g)
    perm = torch.randperm(n, generator=g)
    n_test = round(TEST_FRACTION * n)
    n_val = round(opts.val_fraction * (n - n_test))
    test, val, train = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
    return Graph(x, edges, y, c, train.sort().values, val.sort().values, test.sort().values)


def block_edges(y: Tensor, c: int, m: int, homophily: float, g: torch.Generator) -> Tensor:
    """``m`` random links, then made a simple undirected graph (:func:`undirected_edges`).

    Each link starts at a uniform node; with probability ``homophily`` it ends at a uniform
    node of the same class, otherwise at a uniform node of a uniform other class. That is
    an SBM with within-class and between-class edge rates in the ratio
    ``homophily * (C - 1) / (1 - homophily)``, sampled in O(m) without an N x N matrix;
    self loops and repeated links (rare when sparse) are dropped.
    """
    n = len(y)
    order = torch.argsort(y, stable=True)  # nodes of class k: order[start[k] : start[k] + size[k]]
    size = torch.bincount(y, minlength=c)
    start = torch.cumsum(size, 0) - size
    src = torch.randint(n, (m,), generator=g)
    cls = y[src]
    other = (cls + torch.randint(1, max(c, 2), (m,), generator=g)) % c
    cls = torch.where(torch.rand(m, generator=g) < homophily, cls, other)
    pick = (torch.rand(m, generator=g) * size[cls]).long().clamp_max_(size[cls] - 1)
    dst = order[start[cls] + pick]
    return undirected_edges(src, dst, n)


def topic_features(y: Tensor, c: int, f: int, g: torch.Generator) -> Tensor:
    """Binary features ``[N, f]``: word j is on with probability P_TOPIC if ``j % c == y``
    else P_OTHER, drawn in chunks of rows so the only large allocation is the output."""
    topic = (torch.arange(f) % c)[None, :]
    x = torch.empty(len(y), f)
    for rows in torch.arange(len(y)).split(_CHUNK):
        p = torch.where(topic == y[rows, None], P_TOPIC, P_OTHER)
        x[rows] = (torch.rand(len(rows), f, generator=g) < p).float()
    return x
