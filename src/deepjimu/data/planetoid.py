"""``cora``, ``citeseer``, ``pubmed``: the Planetoid citation graphs (Yang et al., ICML 2016).

Each data set is eight files ``<data-dir>/planetoid/ind.NAME.EXT``, Python 2 pickles (and
one text file) written by the Planetoid code: ``x`` / ``y`` features and one-hot labels of
the labelled training nodes, ``allx`` / ``ally`` of every training-graph node (``x`` is
their first rows), ``tx`` / ``ty`` of the test nodes, ``test.index`` the node id of each test
row, and ``graph`` a dict from node id to its neighbours' ids. They are read with a
restricted unpickler (numpy, scipy.sparse and collections classes only).
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from deepjimu.choices import Split
from deepjimu.data.base import DataOptions
from deepjimu.data.download import local_or_fetched
from deepjimu.data.graph import Graph, register_graph_dataset, undirected_edges
from deepjimu.data.safepickle import RestrictedUnpickler, numpy_globals
from deepjimu.errors import JimuError, one_line

__all__ = [
    "FILES",
    "PLANETOID",
    "load_planetoid",
    "public_split",
    "random_split",
    "read_features",
    "read_graph",
    "read_labels",
    "read_test_index",
]

PLANETOID = ("cora", "citeseer", "pubmed")
FILES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
VAL_SIZE = 500  # the public split's validation nodes: the 500 after the training nodes


def _allowed() -> dict[tuple[str, str], Any]:
    import scipy.sparse  # here, not at import: it adds a second to every start-up

    csr = scipy.sparse.csr_matrix
    scalar = np.int64(0).__reduce__()[0]  # rebuilds a numpy scalar (a node id may be one)
    return {
        **numpy_globals(),
        ("numpy.core.multiarray", "scalar"): scalar,
        ("numpy._core.multiarray", "scalar"): scalar,
        # the module the class was pickled from: scipy < 1.8, scipy >= 1.8, the public name
        ("scipy.sparse.csr", "csr_matrix"): csr,
        ("scipy.sparse._csr", "csr_matrix"): csr,
        ("scipy.sparse", "csr_matrix"): csr,
        ("collections", "defaultdict"): collections.defaultdict,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("__builtin__", "list"): list,  # the defaultdict's factory (Python 2 spelling)
        ("builtins", "list"): list,
    }


def _unpickle(path: Path, shown: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return RestrictedUnpickler(f, _allowed(), encoding="latin1").load()
    except OSError as e:
        raise JimuError(f"{shown}: cannot be read ({one_line(e)})") from None
    except Exception as e:  # a corrupt or hostile pickle can fail in almost any way
        raise JimuError(
            f"{shown}: not a readable Planetoid pickle ({type(e).__name__}: {one_line(e)})"
        ) from None


def _numeric(arr: object, shown: Path, what: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf" or arr.ndim != 2:
        got = (
            f"{arr.dtype} array of shape {arr.shape}"
            if isinstance(arr, np.ndarray)
            else type(arr).__name__
        )
        raise JimuError(f"{shown}: expected {what} (a 2-D numeric array), got {got}")
    return arr


def read_features(path: Path, shown: Path | None = None) -> np.ndarray:
    """Node features of ``ind.NAME.{x,tx,allx}``: a CSR matrix (or array) -> float32 ``[n, F]``.

    The sparse matrix is rebuilt from its arrays and fully checked, so a damaged one is an
    error here rather than a wrong result later.

    Raises:
        JimuError: unreadable or refused pickle, not a matrix, bad sparse structure, or a
            value that is not finite; naming ``shown`` (default ``path``).
    """
    import scipy.sparse

    shown = shown or path
    obj = _unpickle(path, shown)
    if isinstance(obj, scipy.sparse.csr_matrix):
        try:
            m = scipy.sparse.csr_matrix((obj.data, obj.indices, obj.indptr), shape=obj.shape)
            m.check_format(full_check=True)
            obj = m.toarray()
        except Exception as e:  # missing attributes, inconsistent arrays, indices out of range
            raise JimuError(
                f"{shown}: damaged sparse feature matrix ({type(e).__name__}: {one_line(e)})"
            ) from None
    x = _numeric(obj, shown, "a feature matrix").astype(np.float32)
    if not np.isfinite(x).all():
        raise JimuError(f"{shown}: features that are not finite numbers")
    return x


def read_labels(path: Path, shown: Path | None = None) -> tuple[np.ndarray, int]:
    """Labels of ``ind.NAME.{y,ty,ally}`` (one-hot rows) -> (int64 ``[n]``, classes).

    A row of zeros is a node without a label (-1).

    Raises:
        JimuError: not a 0/1 matrix, or a row with more than one label.
    """
    shown = shown or path
    onehot = _numeric(_unpickle(path, shown), shown, "one-hot labels")
    if not np.isin(onehot, (0, 1)).all():
        raise JimuError(f"{shown}: one-hot labels must be 0 or 1")
    count = onehot.sum(1)
    if (count > 1).any():
        i = int(np.argmax(count > 1))
        raise JimuError(f"{shown}: row {i} has {int(count[i])} labels (one-hot rows have one)")
    labels = np.where(count == 1, onehot.argmax(1), -1).astype(np.int64)
    return labels, onehot.shape[1]


def read_graph(path: Path, shown: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Links of ``ind.NAME.graph`` (a dict: node id -> neighbour ids) -> (src, dst) int64.

    Raises:
        JimuError: not a dict of lists of integers, or a negative node id.
    """
    shown = shown or path
    obj = _unpickle(path, shown)
    if not isinstance(obj, dict):
        raise JimuError(f"{shown}: expected a dict of neighbour lists, got {type(obj).__name__}")
    try:
        keys = np.fromiter(obj.keys(), np.int64, len(obj))
        src = np.repeat(keys, [len(v) for v in obj.values()])
        dst = np.fromiter(itertools.chain.from_iterable(obj.values()), np.int64, len(src))
    except (TypeError, ValueError, OverflowError):
        raise JimuError(f"{shown}: expected a dict from node ids to lists of node ids") from None
    if len(src) and min(src.min(), dst.min()) < 0:
        raise JimuError(f"{shown}: negative node id {min(src.min(), dst.min())}")
    return src, dst


def read_test_index(path: Path, shown: Path | None = None) -> np.ndarray:
    """Node ids of the test rows, one per line of ``ind.NAME.test.index`` -> int64 ``[n]``.

    Raises:
        JimuError: unreadable, a line that is not a node id, no ids, or an id listed twice.
    """
    shown = shown or path
    try:
        lines = path.read_bytes().decode("ascii").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise JimuError(f"{shown}: cannot be read as text ({one_line(e)})") from None
    ids = []
    for i, line in enumerate(lines, start=1):
        if line.strip():
            if not line.strip().isdigit():
                raise JimuError(f"{shown}: line {i} is not a node id ({line.strip()[:20]!r})")
            ids.append(int(line))
    index = np.array(ids, dtype=np.int64)
    if not len(index):
        raise JimuError(f"{shown}: lists no test nodes")
    if len(np.unique(index)) != len(index):
        raise JimuError(f"{shown}: a test node is listed twice")
    return index


_READERS: dict[str, Callable[[Path, Path | None], Any]] = {
    "x": read_features,
    "tx": read_features,
    "allx": read_features,
    "y": read_labels,
    "ty": read_labels,
    "ally": read_labels,
    "graph": read_graph,
    "test.index": read_test_index,
}


def load_planetoid(name: str, opts: DataOptions) -> Graph:
    """Read ``ind.NAME.*`` from ``opts.data_dir / "planetoid"`` (fetched with ``opts.download``).

    Nodes are numbered as the files number them: the ``allx`` nodes first, then up to the
    largest test index. Citeseer's test index has gaps: ids in its range that name no
    test row. As the community loaders (Kipf & Welling's, PyTorch Geometric) do, such a
    node keeps a row of zero features and no label, and is in no split; it stays in the
    graph (the gap nodes are isolated there). Any node without a label (a zero one-hot row)
    is left out of every split.

    Returns:
        the graph with the split of ``opts.split``: ``public`` (:func:`public_split`) or
        ``random`` (:func:`random_split`, seeded by ``opts.seed``).

    Raises:
        JimuError: a missing file (with a hint to ``--download``), a bad file, or files
            that disagree (feature widths, label counts, test rows), naming the file.
    """
    folder = Path(opts.data_dir) / "planetoid"
    paths = {ext: _locate(name, folder, ext, opts) for ext in FILES}
    x, tx, allx = (read_features(paths[e]) for e in ("x", "tx", "allx"))
    (y, c_y), (ty, c_ty), (ally, num_classes) = (read_labels(paths[e]) for e in ("y", "ty", "ally"))
    test_index = read_test_index(paths["test.index"])
    src, dst = read_graph(paths["graph"])
    width = allx.shape[1]
    for ext, feats in (("x", x), ("tx", tx)):
        if feats.shape[1] != width:
            raise JimuError(
                f"{paths[ext]}: {feats.shape[1]} features per node, but allx has {width}"
            )
    for ext, labels, feats, of in (
        ("y", y, x, "x"),
        ("ally", ally, allx, "allx"),
        ("ty", ty, tx, "tx"),
    ):
        if len(labels) != len(feats):
            raise JimuError(
                f"{paths[ext]}: {len(labels)} labels for the {len(feats)} feature rows of {of}"
            )
    for ext, c in (("y", c_y), ("ty", c_ty)):
        if c != num_classes:
            raise JimuError(f"{paths[ext]}: {c} classes, but ally has {num_classes}")
    if len(y) > len(allx):
        raise JimuError(f"{paths['x']}: {len(x)} training nodes, more than allx's {len(allx)}")
    if len(test_index) != len(tx):
        raise JimuError(
            f"{paths['test.index']}: {len(test_index)} test nodes, but tx has {len(tx)} rows"
        )
    n_all = len(allx)
    if test_index.min() < n_all:
        raise JimuError(
            f"{paths['test.index']}: test node {test_index.min()} is one of the allx nodes "
            f"(0..{n_all - 1})"
        )
    n = int(test_index.max()) + 1
    if len(src) and max(src.max(), dst.max()) >= n:
        raise JimuError(
            f"{paths['graph']}: node id {max(src.max(), dst.max())} out of range 0..{n - 1}"
        )
    features = np.zeros((n, width), np.float32)
    features[:n_all], features[test_index] = allx, tx
    labels = np.full(n, -1, np.int64)
    labels[:n_all], labels[test_index] = ally, ty
    label_t = torch.from_numpy(labels)
    split = public_split(label_t, len(y), n_all, test_index)
    if opts.split == Split.RANDOM:
        split = random_split(label_t, num_classes, split, opts.seed, name)
    edges = undirected_edges(torch.from_numpy(src), torch.from_numpy(dst), n)
    return Graph(torch.from_numpy(features), edges, label_t, num_classes, *split)


def public_split(
    y: Tensor, n_train: int, n_all: int, test_index: np.ndarray
) -> tuple[Tensor, Tensor, Tensor]:
    """Planetoid's split: the first ``n_train`` nodes train, the next 500 (of the allx
    nodes) validate, the listed nodes test; nodes without a label are dropped.

    Returns:
        (train, val, test) node ids, each sorted.
    """
    train = torch.arange(n_train)
    val = torch.arange(n_train, min(n_train + VAL_SIZE, n_all))
    test = torch.from_numpy(np.sort(test_index))
    return tuple(s[y[s] >= 0] for s in (train, val, test))  # type: ignore[return-value]


def random_split(
    y: Tensor,
    num_classes: int,
    public: tuple[Tensor, Tensor, Tensor],
    seed: int,
    name: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """A split of the public one's sizes drawn at random from all labelled nodes.

    Training takes ``len(public train) // classes`` nodes of each class (Cora: 20), then
    validation and test take as many nodes as the public split's (500 and 1,000) from
    the rest, as PyTorch Geometric's ``split="random"`` does; the draw depends on
    ``seed`` only.

    Raises:
        JimuError: a class has too few labelled nodes, or too few nodes are left.
    """
    per_class = len(public[0]) // num_classes
    n_val, n_test = len(public[1]), len(public[2])
    labelled = torch.nonzero(y >= 0).flatten()
    perm = labelled[torch.randperm(len(labelled), generator=torch.Generator().manual_seed(seed))]
    train = []
    for c in range(num_classes):
        members = perm[y[perm] == c]
        if len(members) < per_class:
            raise JimuError(
                f"split random: class {c} of {name} has {len(members)} labelled nodes "
                f"(the split takes {per_class} per class)"
            )
        train.append(members[:per_class])
    chosen = torch.cat(train)
    rest = perm[~torch.isin(perm, chosen)]
    if len(rest) < n_val + n_test:
        raise JimuError(
            f"split random: {name} has {len(rest)} labelled nodes besides the training "
            f"ones, fewer than {n_val} validation + {n_test} test"
        )
    val, test = rest[:n_val], rest[n_val : n_val + n_test]
    return chosen.sort().values, val.sort().values, test.sort().values


def _locate(name: str, folder: Path, ext: str, opts: DataOptions) -> Path:
    path = folder / f"ind.{name}.{ext}"
    return local_or_fetched(name, path, opts.download, opts.data_url, check=_READERS[ext])


for _name in PLANETOID:
    register_graph_dataset(_name)(functools.partial(load_planetoid, _name))
