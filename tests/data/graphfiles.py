"""Helpers for graph data tests: tiny Planetoid files (with a Citeseer-style test-index gap)."""

from __future__ import annotations

import collections
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse

__all__ = ["PlanetoidSet", "make_planetoid_set"]


@dataclass
class PlanetoidSet:
    """The arrays behind generated ``ind.NAME.*`` files, node-numbered as the loader numbers them.

    ``features`` / ``labels`` are per node (a gap node: zero row, label -1); ``links`` the
    neighbour lists written to ``graph``; ``test_index`` in file order.
    """

    name: str
    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    n_train: int
    n_all: int
    test_index: list[int]
    links: dict[int, list[int]]

    @property
    def gaps(self) -> list[int]:
        """Node ids in the test range that the test index does not list."""
        return sorted(set(range(self.n_all, max(self.test_index) + 1)) - set(self.test_index))

    def file_bytes(self) -> dict[str, bytes]:
        """File name -> contents of the eight files, pickled as Planetoid does (protocol 2)."""

        def csr(rows: np.ndarray) -> bytes:
            return pickle.dumps(scipy.sparse.csr_matrix(rows), protocol=2)

        def onehot(labels: np.ndarray) -> bytes:
            return pickle.dumps(np.eye(self.num_classes, dtype=np.int32)[labels], protocol=2)

        test = np.array(self.test_index)
        graph = collections.defaultdict(list, self.links)
        body = {
            "x": csr(self.features[: self.n_train]),
            "y": onehot(self.labels[: self.n_train]),
            "allx": csr(self.features[: self.n_all]),
            "ally": onehot(self.labels[: self.n_all]),
            "tx": csr(self.features[test]),
            "ty": onehot(self.labels[test]),
            "graph": pickle.dumps(graph, protocol=2),
            "test.index": "".join(f"{i}\n" for i in self.test_index).encode(),
        }
        return {f"ind.{self.name}.{ext}": data for ext, data in body.items()}

    def write(self, data_dir: Path) -> Path:
        """Write the files into ``data_dir / "planetoid"``; returns ``data_dir``."""
        folder = data_dir / "planetoid"
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in self.file_bytes().items():
            (folder / name).write_bytes(data)
        return data_dir


def make_planetoid_set(name: str = "citeseer", seed: int = 0) -> PlanetoidSet:
    """18 nodes, 3 classes, 6 binary features: 6 labelled training nodes (2 per class), 10
    more allx nodes (validation), test nodes 16..22 listed out of order without 20 (a gap).

    The graph lists some links one way only, one twice and one self loop, as real files do.
    """
    rng = np.random.default_rng(seed)
    n_train, n_all, c, f = 6, 16, 3, 6
    test_index = [17, 16, 22, 19, 18, 21]
    n = max(test_index) + 1
    labels = np.arange(n) % c
    features = (rng.random((n, f)) < 0.4).astype(np.float32)
    features[np.arange(n), labels] = 1.0  # every node has a word, and one of its class
    gap = sorted(set(range(n_all, n)) - set(test_index))
    features[gap], labels[gap] = 0.0, -1
    links: dict[int, list[int]] = {i: [] for i in range(n)}
    for i in range(n):
        if i not in gap:
            j = (i + 1) % n
            while j in gap:
                j = (j + 1) % n
            links[i].append(j)  # a ring, listed one way
    links[0] += [5, np.int64(5), 0]  # a repeat (as a numpy integer) and a self loop
    return PlanetoidSet(name, features, labels, c, n_train, n_all, test_index, links)
