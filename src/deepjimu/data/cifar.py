"""``cifar10``: 32x32 colour images from the official python-pickle batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset
from deepjimu.data.download import extract_tar, fetch
from deepjimu.data.safepickle import RestrictedUnpickler, numpy_globals
from deepjimu.errors import JimuError, one_line

__all__ = ["ARCHIVE", "FOLDER", "TEST_BATCH", "TRAIN_BATCHES", "load_cifar10", "read_batch"]

ARCHIVE = "cifar-10-python.tar.gz"
FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
NUM_CLASSES = 10
_PIXELS = 3 * 32 * 32


@register_dataset("cifar10", Family.IMAGES)
def load_cifar10(opts: DataOptions) -> RawData:
    """50,000 train / 10,000 test images, float32 ``[N, 3, 32, 32]`` in [0, 1], labels 0..9.

    Reads ``opts.data_dir / "cifar10" / "cifar-10-batches-py"``. If batches are missing, a
    ``cifar-10-python.tar.gz`` in ``opts.data_dir / "cifar10"`` is extracted (fetched first,
    checksum verified, with ``opts.download``).

    Raises:
        JimuError: a missing file (with a hint to ``--download``), or a bad batch.
    """
    root = Path(opts.data_dir) / "cifar10"
    batches = root / FOLDER
    names = (*TRAIN_BATCHES, TEST_BATCH)
    missing = [n for n in names if not (batches / n).is_file()]
    if missing:
        archive = root / ARCHIVE
        if not archive.is_file():
            if not opts.download:
                raise JimuError(
                    f"cifar10: missing file {batches / missing[0]}; "
                    f"run with --download to fetch {ARCHIVE}"
                )
            fetch("cifar10", ARCHIVE, archive, opts.data_url)
        extract_tar(archive, root, FOLDER)
        missing = [n for n in names if not (batches / n).is_file()]
        if missing:
            raise JimuError(
                f"cifar10: missing file {batches / missing[0]}, and extracting {archive} did not "
                f"restore it (remove {batches} to extract afresh)"
            )
    train = [read_batch(batches / n) for n in TRAIN_BATCHES]
    test_x, test_y = read_batch(batches / TEST_BATCH)
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    return RawData(train_x, train_y, test_x, test_y, num_classes=NUM_CLASSES)


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 pickle batch: images float32 ``[N, 3, 32, 32]`` in [0, 1], labels int64.

    Only numpy arrays and plain containers are unpickled; any other global is refused, so
    a tampered file cannot run code.

    Raises:
        JimuError: unreadable pickle, missing ``data`` / ``labels``, wrong dims, label out of
            range, or image and label counts that differ.

    Example:
        >>> x, y = read_batch(Path("data/cifar10/cifar-10-batches-py/test_batch"))
        >>> x.shape, y.shape
        ((10000, 3, 32, 32), (10000,))
    """
    try:
        with open(path, "rb") as f:
            batch = RestrictedUnpickler(f, numpy_globals(), encoding="latin1").load()
    except OSError as e:
        raise JimuError(f"{path}: cannot be read ({one_line(e)})") from None
    except Exception as e:  # a corrupt pickle can fail in almost any way
        raise JimuError(
            f"{path}: not a readable pickle batch ({type(e).__name__}: {one_line(e)})"
        ) from None
    if not isinstance(batch, dict):
        raise JimuError(f"{path}: not a CIFAR batch (a {type(batch).__name__}, not a dict)")
    data, labels = _key(batch, "data", path), _key(batch, "labels", path)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        raise JimuError(f"{path}: 'data' must be a uint8 array (got {_describe(data)})")
    if data.ndim != 2 or data.shape[1] != _PIXELS:
        raise JimuError(
            f"{path}: wrong dims of 'data' {data.shape} (expected (N, {_PIXELS}) for 3x32x32)"
        )
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        raise JimuError(f"{path}: 'labels' must be a list of integers") from None
    if y.ndim != 1 or len(y) != len(data):
        raise JimuError(f"{path}: {len(data)} images but {y.size} labels (labels shape {y.shape})")
    bad = (y < 0) | (y >= NUM_CLASSES)
    if bad.any():
        i = int(np.argmax(bad))
        raise JimuError(f"{path}: label {y[i]} at index {i} out of range 0..{NUM_CLASSES - 1}")
    x = data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    return x, y


def _key(batch: dict[Any, Any], key: str, path: Path) -> Any:
    for k in (key, key.encode()):
        if k in batch:
            return batch[k]
    keys = ", ".join(sorted(repr(k) for k in batch))
    raise JimuError(f"{path}: missing key {key!r} (keys: {keys or 'none'})")


def _describe(v: object) -> str:
    if isinstance(v, np.ndarray):
        return f"{v.dtype} array of shape {v.shape}"
    return type(v).__name__
