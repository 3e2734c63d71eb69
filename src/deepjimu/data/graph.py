"""Graph data sets: the normalised adjacency, propagated node features, and their rows per split.

A graph loader returns a :class:`Graph` (node features, edges, labels, split node indices).
:func:`register_graph_dataset` turns it into a data set of feature rows: with
``A_hat = D^-1/2 (A + I) D^-1/2`` (Kipf & Welling's renormalised adjacency), each node's
row is ``[X, A_hat X, ..., A_hat^K X]`` (``concat``, the GA-MLP input of pdADMM-G) or
``A_hat^K X`` (``last``, SGC), so every strategy trains on rows and needs no graph code.
Graph models (``gcn``) get the node-level :class:`GraphData` instead. Everything is
computed once, with torch sparse tensors: nothing is ever N x N dense.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from deepjimu.choices import Family, GraphFeatures
from deepjimu.data.base import DataOptions, GraphData, RawData, quiet_csr, register_dataset
from deepjimu.memory import peak_memory_mb

__all__ = [
    "GRAPH_DATASETS",
    "Graph",
    "graph_rows",
    "hop_features",
    "normalized_adjacency",
    "register_graph_dataset",
    "undirected_edges",
]

GRAPH_DATASETS: set[str] = set()


@dataclass
class Graph:
    """A node-classification graph as a loader returns it.

    ``x``: float32 node features ``[N, F]``; ``edges``: int64 ``[2, E]`` holding both
    directions of every undirected edge, without self loops or repeats (see
    :func:`undirected_edges`); ``y``: int64 labels ``[N]``, -1 for a node without one;
    ``*_idx``: int64 node indices of each split (labelled nodes only).
    """

    x: Tensor
    edges: Tensor
    y: Tensor
    num_classes: int
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor


def undirected_edges(src: Tensor, dst: Tensor, n: int) -> Tensor:
    """The undirected simple graph of the links ``src[i] - dst[i]``: ``[2, E]``, both directions.

    Links are symmetrised, self loops dropped and repeats merged (via a sort of the keys
    ``row * n + col``, so memory stays linear in the number of links).

    Example:
        >>> undirected_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 0, 2]), 3)
        tensor([[0, 1],
                [1, 0]])
    """
    row, col = torch.cat([src, dst]), torch.cat([dst, src])
    keep = row != col
    key = torch.unique(row[keep] * n + col[keep])
    return torch.stack([key // n, key % n])


def normalized_adjacency(edges: Tensor, n: int) -> Tensor:
    """``A_hat = D^-1/2 (A + I) D^-1/2`` as a sparse CSR tensor, D the degrees of ``A + I``.

    Args:
        edges: ``[2, E]`` int64, both directions of each edge, no self loops.
        n: number of nodes.

    Returns:
        float32 sparse CSR ``[n, n]`` with ``E + n`` stored values.

    Example:
        >>> normalized_adjacency(torch.tensor([[0, 1], [1, 0]]), 2).to_dense()
        tensor([[0.5000, 0.5000],
                [0.5000, 0.5000]])
    """
    loops = torch.arange(n)
    row, col = torch.cat([edges[0], loops]), torch.cat([edges[1], loops])
    d_inv_sqrt = torch.bincount(row, minlength=n).float().rsqrt()
    values = d_inv_sqrt[row] * d_inv_sqrt[col]
    # the indices are built here, in range by construction: no invariant checks needed
    coo = torch.sparse_coo_tensor(
        torch.stack([row, col]), values, (n, n), check_invariants=False
    ).coalesce()
    with quiet_csr():
        return coo.to_sparse_csr()


def hop_features(
    adj: Tensor, x: Tensor, hops: int, mode: GraphFeatures, nodes: Sequence[Tensor]
) -> list[Tensor]:
    """The rows of ``nodes`` of the features propagated ``hops`` times by ``adj``.

    Args:
        adj: ``A_hat``, sparse ``[N, N]``.
        x: node features ``[N, F]``.
        hops: K >= 0.
        mode: ``concat`` -> ``[X, A X, ..., A^K X]``, ``(K+1) F`` wide; ``last`` -> ``A^K X``.
        nodes: index tensors (e.g. the splits' nodes); one block of rows is returned per
            tensor.

    Returns:
        float32 rows per entry of ``nodes``. Only these rows are kept: peak memory is
        the rows plus two ``[N, F]`` blocks, not the whole ``[N, (K+1) F]`` matrix.

    Example:
        >>> train, test = hop_features(adj, x, 2, GraphFeatures.CONCAT, [train_idx, test_idx])  # doctest: +SKIP
    """
    f = x.shape[1]
    width = f if mode == GraphFeatures.LAST else (hops + 1) * f
    out = [x.new_empty(len(idx), width) for idx in nodes]
    h = x
    for k in range(hops + 1):
        if k:
            h = torch.sparse.mm(adj, h)
        if mode == GraphFeatures.CONCAT or k == hops:
            col = 0 if mode == GraphFeatures.LAST else k * f
            for rows, idx in zip(out, nodes, strict=True):
                rows[:, col : col + f] = h.index_select(0, idx)
    return out


def graph_rows(g: Graph, opts: DataOptions) -> RawData:
    """The feature rows of each split of ``g`` (or, for a graph model, its raw feature rows
    plus the node-level :class:`GraphData`), with the preprocessing's time and memory in ``info``.

    Row normalisation (``opts.graph_row_norm``) divides each node's raw features by the sum
    of their absolute values (for the non-negative word counts of Planetoid: by their sum,
    as GCN and SGC do) before any propagation.
    """
    t0 = time.perf_counter()
    n = len(g.y)
    x = F.normalize(g.x, p=1, dim=1) if opts.graph_row_norm else g.x
    adj = normalized_adjacency(g.edges, n)
    nodes = [g.train_idx, g.val_idx, g.test_idx]
    # a graph model propagates by itself: its rows are the raw features
    hops = 0 if opts.node_level else opts.graph_hops
    train_x, val_x, test_x = hop_features(adj, x, hops, opts.graph_features, nodes)
    seconds = time.perf_counter() - t0
    adj_bytes = sum(
        t.numel() * t.element_size() for t in (adj.crow_indices(), adj.col_indices(), adj.values())
    )
    rows_bytes = sum(t.numel() * t.element_size() for t in (train_x, val_x, test_x))
    info = {
        "graph_nodes": n,
        "graph_edges": g.edges.shape[1] // 2,
        "graph_feature_dim": train_x.shape[1],
        "preprocess_s": round(seconds, 3),
        "rows_mb": round(rows_bytes / 2**20, 1),
        "adjacency_mb": round(adj_bytes / 2**20, 1),
        "peak_rss_mb": round(peak_memory_mb(torch.device("cpu")), 1),
    }
    graph = None
    if opts.node_level:
        graph = GraphData(x, adj, g.y, g.train_idx, g.val_idx, g.test_idx)
    return RawData(
        train_x,
        g.y[g.train_idx],
        test_x,
        g.y[g.test_idx],
        num_classes=g.num_classes,
        val_x=val_x,
        val_y=g.y[g.val_idx],
        graph=graph,
        info=info,
    )


def register_graph_dataset(
    name: str,
) -> Callable[[Callable[[DataOptions], Graph]], Callable[[DataOptions], Graph]]:
    """Decorator: make a loader of a :class:`Graph` available as ``--dataset name`` (feature rows)."""

    def deco(loader: Callable[[DataOptions], Graph]) -> Callable[[DataOptions], Graph]:
        def rows(opts: DataOptions) -> RawData:
            t0 = time.perf_counter()
            g = loader(opts)
            load_s = time.perf_counter() - t0
            raw = graph_rows(g, opts)
            raw.info = {"load_s": round(load_s, 3), **raw.info}
            return raw

        GRAPH_DATASETS.add(name)
        register_dataset(name, Family.GRAPH)(rows)
        return loader

    return deco
