"""Helpers for data tests: write tiny IDX files, CIFAR batches and tarballs."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "CIFAR_BATCHES",
    "IDX_FILES",
    "CifarSet",
    "IdxSet",
    "Server",
    "add_tar_file",
    "idx_bytes",
    "make_cifar_set",
    "make_idx_set",
    "md5",
    "py2_batch_bytes",
]

IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR_BATCHES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """An IDX file: big-endian magic, one uint32 per dimension, then the uint8 values."""
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return magic.to_bytes(4, "big") + dims + np.ascontiguousarray(array, np.uint8).tobytes()


def md5(data: bytes) -> str:
    """Hex MD5 of ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@dataclass
class IdxSet:
    """The arrays behind a generated IDX dataset, as uint8 images and labels per split."""

    images: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]

    def file_bytes(self, gz: bool = True) -> dict[str, bytes]:
        """File name -> contents of the four files (``.gz`` names and gzip if ``gz``)."""
        out = {}
        for split, (img, lbl) in IDX_FILES.items():
            for base, data in (
                (img, idx_bytes(self.images[split], 0x803)),
                (lbl, idx_bytes(self.labels[split], 0x801)),
            ):
                out[base + ".gz" if gz else base] = gzip.compress(data, mtime=0) if gz else data
        return out

    def write(self, folder: Path, gz: bool = True) -> Path:
        """Write the four files into ``folder``; returns ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in self.file_bytes(gz).items():
            (folder / name).write_bytes(data)
        return folder


def make_idx_set(n_train: int = 40, n_test: int = 20, seed: int = 0) -> IdxSet:
    """Random 28x28 uint8 images; labels cycle through 0..9 so every class is present."""
    rng = np.random.default_rng(seed)
    images = {
        "train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
    }
    labels = {
        "train": (np.arange(n_train) % 10).astype(np.uint8),
        "test": (np.arange(n_test) % 10).astype(np.uint8),
    }
    return IdxSet(images, labels)


@dataclass
class CifarSet:
    """Per-batch uint8 data ``[n, 3072]`` and label lists of a generated CIFAR-10 folder."""

    data: dict[str, np.ndarray]
    labels: dict[str, list[int]]

    def batch_bytes(self, name: str) -> bytes:
        """The pickle of one batch, laid out as the official files (bytes keys)."""
        batch = {
            b"batch_label": name.encode(),
            b"data": self.data[name],
            b"labels": self.labels[name],
        }
        return pickle.dumps(batch, protocol=2)

    def write(self, folder: Path) -> Path:
        """Write the six batches into ``folder`` (a ``cifar-10-batches-py``); returns it."""
        folder.mkdir(parents=True, exist_ok=True)
        for name in CIFAR_BATCHES:
            (folder / name).write_bytes(self.batch_bytes(name))
        return folder

    def tarball(self) -> bytes:
        """A ``cifar-10-python.tar.gz`` holding ``cifar-10-batches-py/<batch>`` members."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.addfile(_tar_dir("cifar-10-batches-py"))
            for name in CIFAR_BATCHES:
                add_tar_file(tar, f"cifar-10-batches-py/{name}", self.batch_bytes(name))
        return buf.getvalue()


def _tar_dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info


def add_tar_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add a regular file member ``name`` with ``data`` to an open tar."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make_cifar_set(n: int = 4, seed: int = 0) -> CifarSet:
    """``n`` random images per batch; labels cycle through 0..9."""
    rng = np.random.default_rng(seed)
    data = {b: rng.integers(0, 256, (n, 3072), dtype=np.uint8) for b in CIFAR_BATCHES}
    labels = {b: [int((i + k) % 10) for i in range(n)] for k, b in enumerate(CIFAR_BATCHES)}
    return CifarSet(data, labels)


@dataclass
class Server:
    """A local HTTP server: ``routes`` maps a path to ``(body, mode)``; ``hits`` records GETs.

    Modes: ``ok``; ``short`` (Content-Length 1000 bytes larger than the body, then close);
    ``cut`` (true Content-Length, half the body, then close). Unknown paths get 404.
    """

    url: str
    routes: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)

    def serve(self, files: dict[str, bytes], prefix: str = "", mode: str = "ok") -> None:
        """Serve each ``name -> body`` at ``/<prefix>/<name>``."""
        for name, body in files.items():
            self.routes[f"{prefix}/{name}"] = (body, mode)


def py2_batch_bytes(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch pickled as the official files are: Python 2 protocol 2, ``str`` keys and pixels.

    Written opcode by opcode, since Python 3 cannot produce Python 2 ``str`` objects.
    """

    def text(b: bytes) -> bytes:  # SHORT_BINSTRING / BINSTRING
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def num(n: int) -> bytes:  # BININT1 / BININT
        return b"K" + bytes([n]) if 0 <= n < 256 else b"J" + struct.pack("<i", n)

    n, width = data.shape
    out = b"\x80\x02}(" + text(b"data")
    out += b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
    out += num(0) + b"\x85" + text(b"b") + b"\x87R"  # _reconstruct(ndarray, (0,), 'b')
    out += b"(" + num(1) + num(n) + num(width) + b"\x86"  # state: version, shape,
    out += b"cnumpy\ndtype\n" + text(b"u1") + num(0) + num(1) + b"\x87R"  # dtype('u1'),
    out += b"(" + num(3) + text(b"|") + b"NNN" + num(-1) + num(-1) + num(0) + b"tb"
    out += b"\x89" + text(np.ascontiguousarray(data, np.uint8).tobytes()) + b"tb"  # C order, bytes
    out += text(b"labels") + b"](" + b"".join(num(v) for v in labels) + b"eu."
    return out
