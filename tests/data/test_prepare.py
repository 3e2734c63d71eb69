"""The shared preprocessing of data/base.py: down-sample, class subset, normalise, split, shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from datafiles import IdxSet

from deepjimu.choices import Family
from deepjimu.data import (
    GRAPH_DATASETS,
    DataOptions,
    DataSplits,
    dataset_family,
    dataset_names,
    datasets_of,
    load_dataset,
)
from deepjimu.data.base import per_class_split, standardize
from deepjimu.errors import JimuError


@pytest.fixture
def data_dir(tmp_path: Path, idx_set: IdxSet) -> Path:
    """A folder holding the small generated mnist files."""
    idx_set.write(tmp_path / "mnist")
    return tmp_path


def test_registry_names() -> None:
    assert {"digits", "synthetic", "mnist", "fashion-mnist", "kmnist", "cifar10"} <= set(
        dataset_names()
    )
    with pytest.raises(JimuError, match="unknown dataset 'nope'"):
        load_dataset("nope")


def test_every_data_set_names_its_family() -> None:
    assert {n: dataset_family(n) for n in dataset_names()} == {
        **dict.fromkeys(
            ["cifar10", "digits", "eurosat", "eurosat-ms", "fashion-mnist", "kmnist", "mnist"],
            Family.IMAGES,
        ),
        **dict.fromkeys(
            ["bow", "indian-pines", "landsat-spectra", "pavia-u", "synthetic"], Family.TABULAR
        ),
        **dict.fromkeys(["citeseer", "cora", "pubmed", "sbm"], Family.GRAPH),
        "shakespeare-char": Family.TEXT,
        "synthetic-text": Family.TEXT,
        "tensors": Family.TENSORS,
    }
    assert datasets_of(Family.GRAPH) == sorted(GRAPH_DATASETS)
    assert dataset_family("nope") is None


def test_downsample_28_to_14(data_dir: Path, idx_set: IdxSet) -> None:
    d = load_dataset("mnist", DataOptions(data_dir=data_dir, downsample=2))
    assert d.feature_shape == (1, 14, 14) and int(np.prod(d.feature_shape)) == 196
    assert d.train_x.shape[1:] == d.val_x.shape[1:] == d.test_x.shape[1:] == (1, 14, 14)
    img = idx_set.images["test"].astype(np.float32) / 255
    pooled = img.reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4))[:, None]
    np.testing.assert_allclose(d.test_x.numpy(), pooled, atol=1e-6)


def test_downsample_flat_data_is_an_error() -> None:
    with pytest.raises(JimuError, match="downsample needs image data"):
        load_dataset("synthetic", DataOptions(downsample=2, synthetic_n=50))


def test_class_subset_remaps_labels(data_dir: Path, idx_set: IdxSet) -> None:
    d = load_dataset("mnist", DataOptions(data_dir=data_dir, classes=(7, 3), val_fraction=0.0))
    assert d.num_classes == 2
    for y in (d.train_y, d.test_y):
        assert set(y.tolist()) == {0, 1}
    src_y = idx_set.labels["test"]
    keep = np.isin(src_y, [7, 3])
    # classes=(7, 3): 7 -> 0, 3 -> 1, in the order given
    np.testing.assert_array_equal(d.test_y.numpy(), np.where(src_y[keep] == 7, 0, 1))
    expect = idx_set.images["test"][keep].astype(np.float32)[:, None] / 255
    np.testing.assert_allclose(d.test_x.numpy(), expect, atol=1e-7)
    assert d.train_size == int(np.isin(idx_set.labels["train"], [7, 3]).sum())


def test_class_subset_out_of_range(data_dir: Path) -> None:
    with pytest.raises(JimuError, match=r"classes \[12\] do not exist in mnist"):
        load_dataset("mnist", DataOptions(data_dir=data_dir, classes=(1, 12)))


def test_normalize_uses_train_statistics() -> None:
    d = load_dataset(
        "synthetic", DataOptions(normalize=True, synthetic_n=400, synthetic_features=8)
    )
    assert torch.allclose(d.train_x.mean(0), torch.zeros(8), atol=1e-5)
    assert torch.allclose(d.train_x.std(0), torch.ones(8), atol=1e-4)
    raw = load_dataset("synthetic", DataOptions(synthetic_n=400, synthetic_features=8))
    mean, std = raw.train_x.mean(0), raw.train_x.std(0)
    torch.testing.assert_close(d.test_x, (raw.test_x - mean) / std, atol=1e-5, rtol=1e-5)


def test_normalize_images_zero_mean(data_dir: Path) -> None:
    d = load_dataset("mnist", DataOptions(data_dir=data_dir, normalize=True))
    assert float(d.train_x.mean(0).abs().max()) < 1e-5


def _val_rows(d: DataSplits) -> list[bytes]:
    return sorted(r.numpy().tobytes() for r in d.val_x.reshape(len(d.val_x), -1))


def test_val_split_sizes_and_seed(data_dir: Path) -> None:
    a = load_dataset("mnist", DataOptions(data_dir=data_dir, val_fraction=0.25, seed=0))
    assert (len(a.train_y), len(a.val_y), len(a.test_y)) == (30, 10, 20)
    assert a.train_size == 30
    b = load_dataset("mnist", DataOptions(data_dir=data_dir, val_fraction=0.25, seed=0))
    assert torch.equal(a.val_x, b.val_x) and torch.equal(a.train_y, b.train_y)
    c = load_dataset("mnist", DataOptions(data_dir=data_dir, val_fraction=0.25, seed=1))
    assert _val_rows(a) != _val_rows(c)
    assert torch.equal(a.test_x, c.test_x)  # the seed only moves the validation split
    # train and val are disjoint and together hold every training row
    rows = [r.numpy().tobytes() for r in torch.cat([a.train_x, a.val_x]).reshape(40, -1)]
    assert len(set(rows)) == 40


def test_no_validation_split(data_dir: Path) -> None:
    d = load_dataset("mnist", DataOptions(data_dir=data_dir, val_fraction=0.0))
    assert len(d.val_y) == 0 and len(d.train_y) == 40


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_partitions_training_rows(world: int) -> None:
    d = load_dataset("synthetic", DataOptions(synthetic_n=203, synthetic_features=5))
    shards = [d.shard(rank, world) for rank in range(world)]
    assert sum(len(s.train_y) for s in shards) == len(d.train_y)
    for s in shards:
        assert s.train_size == d.train_size and len(s.train_x) == len(s.train_y)
        assert torch.equal(s.val_x, d.val_x) and torch.equal(s.test_x, d.test_x)
    rows = [tuple(r.tolist()) for s in shards for r in s.train_x]
    assert len(rows) == len(set(rows))  # disjoint
    assert sorted(rows) == sorted(tuple(r.tolist()) for r in d.train_x)  # union is everything
    labels = {tuple(r.tolist()): int(y) for r, y in zip(d.train_x, d.train_y, strict=True)}
    for s in shards:
        assert all(
            labels[tuple(r.tolist())] == int(y) for r, y in zip(s.train_x, s.train_y, strict=True)
        )


def test_digits_sizes() -> None:
    d = load_dataset("digits", DataOptions())
    assert len(d.train_y) + len(d.val_y) == 1437 and len(d.test_y) == 360
    assert d.feature_shape == (1, 8, 8) and d.num_classes == 10
    assert float(d.train_x.min()) >= 0.0 and float(d.train_x.max()) <= 1.0
    assert str(d.train_y.dtype) == "torch.int64"


def test_images_have_row_major_strides_so_conv_outputs_are_contiguous() -> None:
    d = load_dataset("digits")
    for x in (d.train_x, d.val_x, d.test_x):
        assert x.stride() == (64, 64, 8, 1)
    out = torch.nn.Conv2d(1, 4, 3, padding=1)(d.train_x[torch.arange(0, 40, 3)])
    assert out.is_contiguous()  # a channels-last output cannot be sent by gloo


def test_synthetic_sizes_and_determinism() -> None:
    opts = DataOptions(synthetic_n=500, synthetic_features=12, synthetic_classes=3, seed=4)
    a, b = load_dataset("synthetic", opts), load_dataset("synthetic", opts)
    assert len(a.train_y) + len(a.val_y) == 500 and len(a.test_y) == 100
    assert a.feature_shape == (12,) and a.num_classes == 3
    assert set(a.train_y.tolist()) <= {0, 1, 2}
    for x, y in ((a.train_x, b.train_x), (a.val_x, b.val_x), (a.test_y, b.test_y)):
        assert torch.equal(x, y)
    c = load_dataset("synthetic", DataOptions(synthetic_n=500, synthetic_features=12, seed=5))
    assert not torch.equal(a.test_x, c.test_x)


def test_per_class_split_counts_and_seed() -> None:
    # classes of 20, 10, 5, 2 and 1 rows, shuffled
    y = np.random.default_rng(0).permutation(np.repeat([0, 1, 2, 3, 4], [20, 10, 5, 2, 1]))
    train, test = per_class_split(y, 0.1, seed=3)
    # round(0.1 * n), at least 1, at most n - 1; a class of one row trains
    assert np.bincount(y[train], minlength=5).tolist() == [2, 1, 1, 1, 1]
    assert np.bincount(y[test], minlength=5).tolist() == [18, 9, 4, 1, 0]
    assert sorted([*train, *test]) == list(range(len(y)))
    assert (np.diff(train) > 0).all() and (np.diff(test) > 0).all()
    again, _ = per_class_split(y, 0.1, seed=3)
    other, _ = per_class_split(y, 0.1, seed=4)
    np.testing.assert_array_equal(train, again)
    assert not np.array_equal(train, other)
    train, test = per_class_split(y, 0.8, seed=0)
    assert np.bincount(y[train], minlength=5).tolist() == [16, 8, 4, 1, 1]


def test_standardize_uses_training_rows_only() -> None:
    x = np.array([[1.0, 5.0], [3.0, 5.0], [100.0, 7.0]])
    out = standardize(x, np.array([0, 1]))
    # band 0: mean 2, std 1 over rows 0 and 1; band 1 is constant there: only centred
    np.testing.assert_allclose(out, [[-1, 0], [1, 0], [98, 2]])
    assert out.dtype == np.float32


def test_saved_splits_load_as_they_were_graph_included(tmp_path: Path) -> None:
    # the local launcher's workers read the data set from this file (DataSplits.save)
    data = load_dataset("sbm", DataOptions(synthetic_n=300, node_level=True))
    assert data.graph is not None and data.info
    data.save(tmp_path / "data.pt")
    back = DataSplits.load(tmp_path / "data.pt")
    for name in ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y"):
        torch.testing.assert_close(getattr(back, name), getattr(data, name))
    assert (back.name, back.num_classes, back.train_size, back.info) == (
        data.name,
        data.num_classes,
        data.train_size,
        data.info,
    )
    assert back.feature_shape == data.feature_shape
    assert back.graph is not None
    torch.testing.assert_close(back.graph.adj.to_dense(), data.graph.adj.to_dense())
    torch.testing.assert_close(back.graph.test_idx, data.graph.test_idx)
    back.train_x.add_(1.0)  # mapped copy on write: the file keeps what was saved
    torch.testing.assert_close(DataSplits.load(tmp_path / "data.pt").train_x, data.train_x)
