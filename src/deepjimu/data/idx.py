"""``mnist``, ``fashion-mnist``, ``kmnist``: 28x28 grey images in IDX files, gzipped or plain."""

from __future__ import annotations

import functools
import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset
from deepjimu.data.download import fetch
from deepjimu.errors import JimuError, one_line

__all__ = ["DATASETS", "IMAGES_MAGIC", "LABELS_MAGIC", "find_idx", "load_idx", "read_idx"]

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
DATASETS = ("mnist", "fashion-mnist", "kmnist")
SIDE = 28
NUM_CLASSES = 10
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Parse one IDX file (``.gz`` if the name says so) into a uint8 array of its dimensions.

    The header is a big-endian magic number whose low byte is the number of dimensions,
    then one big-endian uint32 per dimension, then the bytes of the array.

    Args:
        path: the file.
        magic: the expected magic number (:data:`IMAGES_MAGIC` or :data:`LABELS_MAGIC`).

    Returns:
        uint8 array shaped as the header says (a view of the file's bytes).

    Raises:
        JimuError: unreadable file, corrupt gzip, wrong magic, truncated or overlong body.

    Example:
        >>> read_idx(Path("data/mnist/t10k-labels-idx1-ubyte.gz"), LABELS_MAGIC).shape
        (10000,)
    """
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise JimuError(f"{path}: truncated IDX file ({len(raw)} bytes, no header)")
    got = int.from_bytes(raw[:4], "big")
    if got != magic:
        raise JimuError(f"{path}: wrong magic number 0x{got:08x} (expected 0x{magic:08x})")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise JimuError(f"{path}: truncated IDX header ({len(raw)} of {header} bytes)")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    size, body = math.prod(dims), len(raw) - header
    shape = "x".join(map(str, dims))
    if body < size:
        raise JimuError(f"{path}: truncated (header says {shape} = {size} bytes, file has {body})")
    if body > size:
        raise JimuError(f"{path}: {body - size} bytes more than its header ({shape}) says")
    return np.frombuffer(raw, np.uint8, size, header).reshape(dims)


def _read_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            if path.suffix != ".gz":
                return f.read()
            try:
                return gzip.GzipFile(fileobj=f).read()
            except (gzip.BadGzipFile, EOFError, zlib.error) as e:
                raise JimuError(f"{path}: corrupt gzip file ({one_line(e)})") from None
    except OSError as e:
        raise JimuError(f"{path}: cannot be read ({one_line(e)})") from None


def find_idx(folder: Path, base: str) -> Path | None:
    """``folder/base`` if it exists, else ``folder/base.gz`` if that exists, else ``None``."""
    for path in (folder / base, folder / f"{base}.gz"):
        if path.is_file():
            return path
    return None


def load_idx(name: str, opts: DataOptions) -> RawData:
    """Read the four IDX files of ``name`` from ``opts.data_dir / name``; fetch them if asked.

    Images become float32 ``[N, 1, 28, 28]`` in [0, 1]; labels int64 in 0..9. With
    ``opts.download`` missing files are fetched as ``.gz`` (checksums verified).

    Raises:
        JimuError: a missing file (with a hint to ``--download``), or bad file contents.
    """
    folder = Path(opts.data_dir) / name
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split, (images_base, labels_base) in _FILES.items():
        images_path = _locate(name, folder, images_base, opts)
        labels_path = _locate(name, folder, labels_base, opts)
        images = read_idx(images_path, IMAGES_MAGIC)
        labels = read_idx(labels_path, LABELS_MAGIC)
        if images.shape[1:] != (SIDE, SIDE):
            raise JimuError(
                f"{images_path}: wrong image dims {images.shape[1]}x{images.shape[2]} "
                f"(expected {SIDE}x{SIDE})"
            )
        if len(images) != len(labels):
            raise JimuError(
                f"{images_path}: {len(images)} images but {labels_path.name} has "
                f"{len(labels)} labels"
            )
        if len(labels) and labels.max() >= NUM_CLASSES:
            i = int(np.argmax(labels >= NUM_CLASSES))
            raise JimuError(
                f"{labels_path}: label {labels[i]} at index {i} out of range 0..{NUM_CLASSES - 1}"
            )
        x = (images.astype(np.float32) / 255.0)[:, None, :, :]
        arrays[split] = (x, labels.astype(np.int64))
    return RawData(*arrays["train"], *arrays["test"], num_classes=NUM_CLASSES)


def _locate(name: str, folder: Path, base: str, opts: DataOptions) -> Path:
    path = find_idx(folder, base)
    if path is not None:
        return path
    gz = folder / f"{base}.gz"
    if not opts.download:
        raise JimuError(f"{name}: missing file {gz} (or {base}); run with --download to fetch it")
    return fetch(name, gz.name, gz, opts.data_url)


for _name in DATASETS:
    register_dataset(_name, Family.IMAGES)(functools.partial(load_idx, _name))
