"""Dataset registry and the preprocessing every dataset shares (split, subset, down-sample, shard)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from deepjimu.balance import shard_counts
from deepjimu.choices import Family, GraphFeatures, Split
from deepjimu.errors import JimuError
from deepjimu.models import parse_spec

__all__ = [
    "DataOptions",
    "DataSplits",
    "GraphData",
    "RawData",
    "dataset_family",
    "dataset_names",
    "datasets_of",
    "epoch_seed",
    "load_dataset",
    "per_class_split",
    "quiet_csr",
    "register_dataset",
    "standardize",
]


@dataclass(frozen=True)
class DataOptions:
    """What a loader needs to know; built from a RunConfig by :func:`DataOptions.from_config`."""

    data_dir: Path = Path("data")
    download: bool = False
    data_url: str | None = None
    seed: int = 0
    val_fraction: float = 0.1
    downsample: int = 1
    classes: tuple[int, ...] | None = None
    normalize: bool = False
    synthetic_n: int = 10000
    synthetic_features: int = 196
    synthetic_classes: int = 10
    # remote sensing: each class's training share (None: the data set's), pixel windows
    train_fraction: float | None = None
    patch: int = 0
    # graphs: Planetoid split, graph features, SBM, node-level data for graph models
    split: Split = Split.PUBLIC
    graph_hops: int = 2
    graph_features: GraphFeatures = GraphFeatures.LAST
    graph_row_norm: bool = True
    sbm_degree: float = 10.0
    sbm_homophily: float = 0.8
    node_level: bool = False
    # text: characters a sample (the context of a language model)
    block_size: int = 64

    @classmethod
    def from_config(cls, cfg: object) -> DataOptions:
        """Take the data fields of a :class:`~deepjimu.config.RunConfig`."""
        classes = getattr(cfg, "classes", None)
        return cls(
            data_dir=Path(cfg.data_dir),  # type: ignore[attr-defined]
            download=cfg.download,  # type: ignore[attr-defined]
            data_url=cfg.data_url,  # type: ignore[attr-defined]
            seed=cfg.seed,  # type: ignore[attr-defined]
            val_fraction=cfg.val_fraction,  # type: ignore[attr-defined]
            downsample=cfg.downsample,  # type: ignore[attr-defined]
            classes=tuple(classes) if classes else None,
            normalize=cfg.normalize,  # type: ignore[attr-defined]
            synthetic_n=cfg.synthetic_n,  # type: ignore[attr-defined]
            synthetic_features=cfg.synthetic_features,  # type: ignore[attr-defined]
            synthetic_classes=cfg.synthetic_classes,  # type: ignore[attr-defined]
            train_fraction=cfg.train_fraction,  # type: ignore[attr-defined]
            patch=cfg.patch,  # type: ignore[attr-defined]
            split=cfg.split,  # type: ignore[attr-defined]
            graph_hops=cfg.graph_hops,  # type: ignore[attr-defined]
            graph_features=cfg.graph_features,  # type: ignore[attr-defined]
            graph_row_norm=cfg.graph_row_norm,  # type: ignore[attr-defined]
            sbm_degree=cfg.sbm_degree,  # type: ignore[attr-defined]
            sbm_homophily=cfg.sbm_homophily,  # type: ignore[attr-defined]
            node_level=parse_spec(cfg.model).needs_graph,  # type: ignore[attr-defined]
            block_size=cfg.block_size,  # type: ignore[attr-defined]
        )


@dataclass
class GraphData:
    """The whole graph at node level, for models that propagate over it themselves (gcn).

    ``x``: the node features ``[N, F]`` (row-normalised if asked); ``adj``: ``A_hat`` as a
    sparse CSR tensor ``[N, N]``; ``y``: labels ``[N]`` (-1: none); ``*_idx``: the node
    indices of each split, the same nodes as the feature rows of the split.
    """

    x: Tensor
    adj: Tensor
    y: Tensor
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor

    def to(self, device: torch.device | str) -> GraphData:
        """All tensors moved to ``device``."""
        return replace(
            self,
            x=self.x.to(device),
            adj=self.adj.to(device),
            y=self.y.to(device),
            train_idx=self.train_idx.to(device),
            val_idx=self.val_idx.to(device),
            test_idx=self.test_idx.to(device),
        )


@dataclass
class RawData:
    """What a loader returns: train and test arrays as the files hold them.

    ``x`` arrays are float32 in [0, 1] (images) or real-valued (synthetic), shaped
    ``[N, *feature_shape]``; ``y`` arrays are int64 class indices in ``[0, num_classes)``.
    A data set with a predefined validation split (Planetoid's public split) gives
    ``val_x`` / ``val_y``, which :func:`prepare` uses instead of splitting off
    ``val_fraction`` of the training set. ``graph`` is the node-level data of a graph data
    set, given only when a graph model asked for it (``DataOptions.node_level``); ``info``
    holds figures about the loading worth reporting (e.g. preprocessing time and memory);
    ``train_eval_every``: an evaluation scores every so many training rows (1: all);
    ``stream``: a language model's training tokens, whose windows an epoch draws at random
    starts (:meth:`DataSplits.windows`) instead of taking the rows.
    """

    train_x: np.ndarray | Tensor
    train_y: np.ndarray | Tensor
    test_x: np.ndarray | Tensor
    test_y: np.ndarray | Tensor
    num_classes: int
    val_x: np.ndarray | Tensor | None = None
    val_y: np.ndarray | Tensor | None = None
    graph: GraphData | None = None
    info: dict[str, Any] = field(default_factory=dict)
    train_eval_every: int = 1
    stream: np.ndarray | None = None


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of everything random in ``epoch`` of a run seeded ``seed`` (its sample order,
    its text windows, its dropout masks): a function of the two alone, so resume is exact."""
    return seed * 1_000_003 + epoch


@dataclass
class DataSplits:
    """Train / validation / test tensors of one dataset, after preprocessing.

    ``train_size`` is the size of the whole training split; after :meth:`shard` the
    tensors hold only one rank's rows, but ``train_size`` stays the global count.
    ``graph`` (graph models only) is the whole graph at node level, whose split node
    indices name the same nodes as the rows; ``info``: figures about the loading.
    ``stream`` (text data): the training tokens, as float32 ids like the rows, from which
    each epoch draws its windows (:meth:`windows`); the rows (consecutive windows) then
    set how many and are what an evaluation scores. ``stream_part``: which shard of the
    rows this rank holds, so that ranks that split the data draw different windows.
    """

    name: str
    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    feature_shape: tuple[int, ...]
    train_size: int
    graph: GraphData | None = None
    info: dict[str, Any] = field(default_factory=dict)
    train_eval_every: int = 1
    stream: Tensor | None = None
    stream_part: int = 0

    def windows(self, seed: int, epoch: int, steps: int) -> list[tuple[Tensor, Tensor]]:
        """An epoch's batches of a token stream, as nanoGPT samples them: as many windows as
        this rank's rows, each starting at a random place in the training text (its target
        the same window shifted by one), in ``steps`` nearly equal batches. Drawn from
        (seed, epoch, ``stream_part``): a resumed run draws the same, the ranks of one
        model alike, the ranks that split the data each their own.

        Example:
            >>> d = DataSplits("t", torch.zeros(4, 3), torch.zeros(4, 3, dtype=torch.long),
            ...                torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 3),
            ...                torch.zeros(1, 3), 5, (3,), 4, stream=torch.arange(20.0))
            >>> x, y = d.windows(0, 0, 2)[0]
            >>> x.shape, bool((y == x + 1).all())
            (torch.Size([2, 3]), True)
        """
        assert self.stream is not None, "windows of a data set with no token stream"
        block = self.feature_shape[0]
        g = torch.Generator().manual_seed(epoch_seed(seed, epoch) * 1_009 + self.stream_part)
        starts = torch.randint(len(self.stream) - block, (len(self.train_y),), generator=g)
        at = starts.to(self.stream.device)[:, None] + torch.arange(block, device=self.stream.device)
        return [(self.stream[i], self.stream[i + 1].long()) for i in torch.tensor_split(at, steps)]

    def eval_split(self, split: str) -> tuple[Tensor, Tensor]:
        """The rows of ``split`` (train, val or test) that an evaluation scores: all of them,
        but of the training split every ``train_eval_every``-th (a language model's
        training windows are scored as many as its validation windows, not all 15,685)."""
        x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
        if split == "train" and self.train_eval_every > 1:
            return x[:: self.train_eval_every], y[:: self.train_eval_every]
        return x, y

    def shard(self, rank: int, world: int, weights: Sequence[float] | None = None) -> DataSplits:
        """This rank's rows of the training split (rows ``rank::world``); eval splits kept whole.

        With ``weights`` (one per rank, e.g. the ranks' speeds) rank r gets a share of the
        rows in proportion to its weight instead (:func:`shard_sizes`): consecutive runs of
        one fixed shuffle of the rows, the same on every rank.

        Example:
            >>> d = load_dataset("digits").shard(1, 2)
        """
        if world == 1:
            return self
        if weights is None:
            rows = torch.arange(rank, len(self.train_y), world)
        else:
            sizes = shard_counts(len(self.train_y), world, weights)
            start = sum(sizes[:rank])
            shuffle = torch.randperm(len(self.train_y), generator=torch.Generator().manual_seed(0))
            rows = shuffle[start : start + sizes[rank]].sort().values
        return replace(
            self,
            train_x=self.train_x[rows].clone(),
            train_y=self.train_y[rows].clone(),
            stream_part=rank,
        )

    def save(self, path: Path) -> None:
        """Write these splits to ``path``, for :meth:`load`.

        The local launcher reads the data once (it checks the files before any worker
        starts) and saves what it read; its workers map that file instead of each reading,
        parsing and preparing the data set again, which costs a worker more than its start
        (digits: importing scikit-learn, about 1 s; a graph: its propagation).
        """
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.graph is not None:
            values["graph"] = {f.name: getattr(self.graph, f.name) for f in fields(self.graph)}
        torch.save(values, path)

    @classmethod
    def load(cls, path: Path) -> DataSplits:
        """The splits :meth:`save` wrote to ``path``, its tensors mapped from the file (copy
        on write: a change stays in the process that makes it)."""
        with quiet_csr():
            values = torch.load(path, mmap=True, weights_only=True)
        if values["graph"] is not None:
            values["graph"] = GraphData(**values["graph"])
        return cls(**values)

    def to(self, device: torch.device | str) -> DataSplits:
        """All tensors moved to ``device``."""
        return replace(
            self,
            train_x=self.train_x.to(device),
            train_y=self.train_y.to(device),
            val_x=self.val_x.to(device),
            val_y=self.val_y.to(device),
            test_x=self.test_x.to(device),
            test_y=self.test_y.to(device),
            graph=self.graph.to(device) if self.graph is not None else None,
            stream=self.stream.to(device) if self.stream is not None else None,
        )


@contextmanager
def quiet_csr() -> Iterator[None]:
    """Inside, torch's once-per-process warning that sparse CSR tensors are "beta" is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        yield


Loader = Callable[[DataOptions], RawData]
_REGISTRY: dict[str, Loader] = {}
_FAMILY: dict[str, Family] = {}


def register_dataset(name: str, family: Family) -> Callable[[Loader], Loader]:
    """Decorator: make ``loader`` available as ``--dataset name``, a data set of ``family``.

    The family decides which options apply to the data set and which defaults it gets
    (:mod:`deepjimu.defaults`).
    """

    def deco(loader: Loader) -> Loader:
        _REGISTRY[name] = loader
        _FAMILY[name] = family
        return loader

    return deco


def dataset_names() -> list[str]:
    """Registered dataset names, sorted."""
    return sorted(_REGISTRY)


def dataset_family(name: str) -> Family | None:
    """The family of data set ``name`` (None: no such data set)."""
    return _FAMILY.get(name)


def datasets_of(family: Family) -> list[str]:
    """The registered data sets of ``family``, sorted."""
    return sorted(n for n, f in _FAMILY.items() if f == family)


def load_dataset(name: str, opts: DataOptions | None = None) -> DataSplits:
    """Load, validate and preprocess dataset ``name`` into train / val / test splits.

    Args:
        name: a registered name (see :func:`dataset_names`).
        opts: data options; defaults read ``./data`` with seed 0.

    Returns:
        DataSplits with float32 features and int64 labels on the CPU.

    Raises:
        JimuError: unknown dataset, missing or corrupt files, bad class subset.
    """
    opts = opts or DataOptions()
    if name not in _REGISTRY:
        raise JimuError(f"unknown dataset {name!r} (known: {', '.join(dataset_names())})")
    raw = _REGISTRY[name](opts)
    return prepare(name, raw, opts)


def prepare(name: str, raw: RawData, opts: DataOptions) -> DataSplits:
    """Subset classes, down-sample, split off validation, normalise: the shared preprocessing.

    The validation split is ``raw``'s own when it has one, else a seeded random
    ``val_fraction`` of the training set.
    """
    train_x, train_y = _tensors(raw.train_x, raw.train_y)
    test_x, test_y = _tensors(raw.test_x, raw.test_y)
    val: tuple[Tensor, Tensor] | None = None
    if raw.val_x is not None and raw.val_y is not None:
        val = _tensors(raw.val_x, raw.val_y)
    num_classes = raw.num_classes
    graph = raw.graph
    if opts.classes is not None:
        bad = [c for c in opts.classes if not 0 <= c < num_classes]
        if bad:
            raise JimuError(f"classes {bad} do not exist in {name} (classes: 0..{num_classes - 1})")
        if graph is not None:
            raise JimuError(f"classes cannot subset the graph of {name}, which a graph model uses")
        keep = torch.tensor(opts.classes)
        remap = torch.full((num_classes,), -1, dtype=torch.long)
        remap[keep] = torch.arange(len(keep))
        train_x, train_y = _subset(train_x, train_y, keep, remap)
        test_x, test_y = _subset(test_x, test_y, keep, remap)
        if val is not None:
            val = _subset(*val, keep, remap)
        num_classes = len(keep)
    if opts.downsample > 1:
        train_x, test_x = (
            _downsample(train_x, opts.downsample, name),
            _downsample(test_x, opts.downsample, name),
        )
        if val is not None:
            val = (_downsample(val[0], opts.downsample, name), val[1])
    if val is None:
        n_val = round(opts.val_fraction * len(train_y))
        perm = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(opts.seed))
        val_idx, tr_idx = perm[:n_val], perm[n_val:]
        val = train_x[val_idx], train_y[val_idx]
        train_x, train_y = train_x[tr_idx], train_y[tr_idx]
    val_x, val_y = val
    if len(train_y) == 0:
        raise JimuError(f"{name}: no training samples left after preprocessing")
    if opts.normalize:
        mean, std = train_x.mean(0, keepdim=True), train_x.std(0, keepdim=True).clamp_min(1e-6)
        train_x, val_x, test_x = (train_x - mean) / std, (val_x - mean) / std, (test_x - mean) / std
        if graph is not None:  # a graph model's input: the same features, standardised alike
            graph = replace(graph, x=(graph.x - mean) / std)
    return DataSplits(
        name=name,
        train_x=_row_major(train_x),
        train_y=train_y.contiguous(),
        val_x=_row_major(val_x),
        val_y=val_y.contiguous(),
        test_x=_row_major(test_x),
        test_y=test_y.contiguous(),
        num_classes=num_classes,
        feature_shape=tuple(train_x.shape[1:]),
        train_size=len(train_y),
        graph=graph,
        info=dict(raw.info),
        train_eval_every=raw.train_eval_every,
        stream=None if raw.stream is None else torch.from_numpy(raw.stream),
    )


def per_class_split(
    y: np.ndarray, train_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of each class drawn for training, the rest for testing: the split of data sets
    that come without one (remote sensing scenes and patches).

    Class c of n_c rows gives ``round(train_fraction * n_c)`` of them to training, kept
    between 1 and n_c - 1 so that every class with two rows or more is in both splits (a
    class of one row trains). The draw depends on ``seed`` only.

    Returns:
        (train rows, test rows), each sorted.

    Example:
        >>> tr, te = per_class_split(np.array([0, 0, 0, 0, 1, 1]), 0.5, seed=0)
        >>> len(tr), len(te)
        (3, 3)
    """
    rng = np.random.default_rng(seed)
    train = []
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        n = len(rows)
        k = n if n == 1 else min(max(round(train_fraction * n), 1), n - 1)
        train.append(rows[:k])
    chosen = np.sort(np.concatenate(train)) if train else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(len(y)), chosen)
    return chosen, rest


def standardize(x: np.ndarray, rows: np.ndarray, axis: int = 1) -> np.ndarray:
    """``x`` with each feature along ``axis`` (a band) scaled to mean 0 and std 1 over the
    training ``rows`` (and every other axis), float32; constant features are only centred.

    Example:
        >>> standardize(np.array([[1.0], [3.0], [100.0]]), np.array([0, 1])).ravel()
        array([-1.,  1., 98.], dtype=float32)
    """
    x = np.asarray(x, np.float32)
    other = tuple(a for a in range(x.ndim) if a != axis)
    train = x[rows]
    mean = train.mean(axis=other, keepdims=True, dtype=np.float64)
    std = train.std(axis=other, keepdims=True, dtype=np.float64)
    return ((x - mean) / np.where(std > 1e-12, std, 1.0)).astype(np.float32)


def _tensors(x: np.ndarray | Tensor, y: np.ndarray | Tensor) -> tuple[Tensor, Tensor]:
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y).long()


def _subset(x: Tensor, y: Tensor, keep: Tensor, remap: Tensor) -> tuple[Tensor, Tensor]:
    """The rows of ``x, y`` whose class is in ``keep``, labels renumbered by ``remap``."""
    rows = torch.isin(y, keep)
    return x[rows], remap[y[rows]]


def _row_major(x: Tensor) -> Tensor:
    """x with the standard row-major strides, size-1 dimensions included.

    ``contiguous()`` leaves a one-channel image batch strided (H W, 1, W, 1) as it is, and
    conv2d reads that as channels-last and returns a channels-last output, which is not
    contiguous: gloo then refuses to send it (model-parallel and pipeline on a CNN failed).
    """
    if x.stride() == torch.empty(x.shape, device="meta").stride():
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _downsample(x: Tensor, k: int, name: str) -> Tensor:
    """Average-pool images k x k (the papers' 2x per side: MNIST 28x28 -> 14x14 = 196 features)."""
    if x.dim() != 4:
        raise JimuError(f"downsample needs image data; {name} has flat features")
    if x.shape[-1] < k or x.shape[-2] < k:
        raise JimuError(f"downsample {k} is larger than the {name} images ({tuple(x.shape[-2:])})")
    return F.avg_pool2d(x, k)
