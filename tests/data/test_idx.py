"""IDX datasets (mnist, fashion-mnist, kmnist): parsing, loading, and one-line errors for bad files."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from datafiles import IdxSet, idx_bytes

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx
from deepjimu.errors import JimuError


def _rows(x: np.ndarray, y: np.ndarray) -> list[tuple[bytes, int]]:
    """(pixel bytes, label) pairs as a sorted list, so splits can be compared as multisets."""
    pixels = np.rint(x.reshape(len(x), -1) * 255).astype(np.uint8)
    return sorted((p.tobytes(), int(lbl)) for p, lbl in zip(pixels, y, strict=True))


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "kmnist"])
@pytest.mark.parametrize("gz", [True, False])
def test_load_idx_dataset(tmp_path: Path, idx_set: IdxSet, name: str, gz: bool) -> None:
    idx_set.write(tmp_path / name, gz=gz)
    d = load_dataset(name, DataOptions(data_dir=tmp_path, val_fraction=0.25))
    assert d.feature_shape == (1, 28, 28) and d.num_classes == 10
    assert d.train_x.shape == (30, 1, 28, 28) and d.val_x.shape == (10, 1, 28, 28)
    assert d.test_x.shape == (20, 1, 28, 28)
    for x, y in ((d.train_x, d.train_y), (d.val_x, d.val_y), (d.test_x, d.test_y)):
        assert x.dtype.is_floating_point and str(x.dtype) == "torch.float32"
        assert str(y.dtype) == "torch.int64"
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    expect = idx_set.images["test"].astype(np.float32)[:, None] / 255
    np.testing.assert_allclose(d.test_x.numpy(), expect, atol=1e-7)
    np.testing.assert_array_equal(d.test_y.numpy(), idx_set.labels["test"])
    # train + val together are exactly the rows of the training files
    x = np.concatenate([d.train_x.numpy(), d.val_x.numpy()])
    y = np.concatenate([d.train_y.numpy(), d.val_y.numpy()])
    src = idx_set.images["train"].astype(np.float32)[:, None] / 255
    assert _rows(x, y) == _rows(src, idx_set.labels["train"])


def test_plain_file_preferred_over_gz(tmp_path: Path, idx_set: IdxSet) -> None:
    folder = idx_set.write(tmp_path / "mnist", gz=True)
    # a valid plain copy of one file next to a corrupt .gz: the plain file is read
    (folder / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(idx_set.labels["test"], 0x801))
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip")
    d = load_dataset("mnist", DataOptions(data_dir=tmp_path))
    np.testing.assert_array_equal(d.test_y.numpy(), idx_set.labels["test"])


def test_read_idx_returns_header_dims(tmp_path: Path) -> None:
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    p = tmp_path / "a-idx3-ubyte"
    p.write_bytes(idx_bytes(a, IMAGES_MAGIC))
    np.testing.assert_array_equal(read_idx(p, IMAGES_MAGIC), a)
    p.with_suffix(".gz").write_bytes(gzip.compress(idx_bytes(a[0, 0], LABELS_MAGIC)))
    np.testing.assert_array_equal(read_idx(p.with_suffix(".gz"), LABELS_MAGIC), a[0, 0])


TRAIN_IMAGES = "train-images-idx3-ubyte.gz"
TRAIN_LABELS = "train-labels-idx1-ubyte.gz"
TEST_LABELS = "t10k-labels-idx1-ubyte.gz"


def _put(folder: Path, name: str, data: bytes) -> None:
    (folder / name).write_bytes(gzip.compress(data))


BAD_CASES: dict[str, tuple[Callable[[Path, IdxSet], None], str, str]] = {
    "missing file": (
        lambda f, s: (f / TRAIN_LABELS).unlink(),
        TRAIN_LABELS,
        "missing file",
    ),
    "truncated": (
        lambda f, s: _put(f, TRAIN_IMAGES, idx_bytes(s.images["train"], IMAGES_MAGIC)[:-100]),
        TRAIN_IMAGES,
        "truncated",
    ),
    "truncated header": (
        lambda f, s: _put(f, TRAIN_IMAGES, idx_bytes(s.images["train"], IMAGES_MAGIC)[:10]),
        TRAIN_IMAGES,
        "truncated IDX header",
    ),
    "overlong": (
        lambda f, s: _put(f, TRAIN_LABELS, idx_bytes(s.labels["train"], LABELS_MAGIC) + b"xx"),
        TRAIN_LABELS,
        "2 bytes more than its header",
    ),
    "truncated gzip": (
        lambda f, s: (f / TRAIN_IMAGES).write_bytes((f / TRAIN_IMAGES).read_bytes()[:-500]),
        TRAIN_IMAGES,
        "corrupt gzip",
    ),
    "not gzip": (
        lambda f, s: (f / TRAIN_IMAGES).write_bytes(b"\x00" * 64),
        TRAIN_IMAGES,
        "corrupt gzip",
    ),
    "wrong magic": (
        lambda f, s: _put(f, TRAIN_IMAGES, idx_bytes(s.images["train"], 0x00000802)),
        TRAIN_IMAGES,
        "wrong magic number 0x00000802",
    ),
    "label out of range": (
        lambda f, s: _put(f, TEST_LABELS, idx_bytes(s.labels["test"] + 5, LABELS_MAGIC)),
        TEST_LABELS,
        "label 10 at index 5 out of range 0..9",
    ),
    "count mismatch": (
        lambda f, s: _put(f, TRAIN_LABELS, idx_bytes(s.labels["train"][:-1], LABELS_MAGIC)),
        TRAIN_IMAGES,
        "40 images but train-labels-idx1-ubyte.gz has 39 labels",
    ),
    "wrong dims": (
        lambda f, s: _put(f, TRAIN_IMAGES, idx_bytes(s.images["train"][:, :, :27], IMAGES_MAGIC)),
        TRAIN_IMAGES,
        "wrong image dims 28x27",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_idx_file_is_one_line_error(tmp_path: Path, idx_set: IdxSet, case: str) -> None:
    spoil, file_name, problem = BAD_CASES[case]
    folder = idx_set.write(tmp_path / "mnist", gz=True)
    spoil(folder, idx_set)
    with pytest.raises(JimuError) as err:
        load_dataset("mnist", DataOptions(data_dir=tmp_path))
    msg = str(err.value).replace(str(tmp_path), "<tmp>")  # the problem, not the test name
    assert "\n" not in msg
    assert file_name in msg and problem in msg
    if case == "missing file":
        assert "--download" in msg


def test_missing_folder_names_first_file(tmp_path: Path) -> None:
    with pytest.raises(JimuError, match=r"kmnist: missing file .*train-images-idx3-ubyte\.gz"):
        load_dataset("kmnist", DataOptions(data_dir=tmp_path))
