"""``digits``: scikit-learn's bundled 8x8 handwritten digits, the embedded default (no network)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import os
import zipfile
from pathlib import Path

import numpy as np

from deepjimu.atomic import atomic_write_bytes
from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, register_dataset
from deepjimu.errors import JimuError

__all__ = ["load_digits_raw", "split_cache"]

_FORMAT = 1  # raised whenever _split's arrays change, so that no older cache is read


def split_cache(seed: int) -> Path | None:
    """Where the split at ``seed`` is kept between processes: the user's cache folder
    (``$XDG_CACHE_HOME``, else ``~/.cache``), named by scikit-learn's version, which makes
    the split; None where scikit-learn is not installed (the load then says so) or there is
    no home folder to find."""
    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        return None
    root = os.environ.get("XDG_CACHE_HOME")
    if not root:
        try:
            root = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):  # no home to find: no cache
            return None
    return Path(root) / "deepjimu" / f"digits-v{_FORMAT}-sklearn{version}-seed{seed}.npz"


@register_dataset("digits", Family.IMAGES)
def load_digits_raw(opts: DataOptions) -> RawData:
    """1,797 images, 1 x 8 x 8, pixels / 16; a stratified 80/20 train/test split with ``opts.seed``.

    This is the split of the reference measurements (1,437 train / 360 test at seed 0).
    Every worker of a run loads it, and importing scikit-learn costs about a second of CPU
    per process (more than a short run's training), so the split is made by scikit-learn
    once and kept in :func:`split_cache` (a missing, unreadable or unwritable cache only
    means scikit-learn makes it again).
    """
    cache = split_cache(opts.seed)
    if cache is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            with np.load(cache) as kept:
                x, y, test_x, test_y = (kept[k] for k in ("x", "y", "test_x", "test_y"))
            if len(x) + len(test_x) == 1797 and x.shape[1:] == test_x.shape[1:] == (1, 8, 8):
                return RawData(x, y, test_x, test_y, num_classes=10)
    raw = _split(opts.seed)
    if cache is not None:
        buffer = io.BytesIO()
        np.savez(buffer, x=raw.train_x, y=raw.train_y, test_x=raw.test_x, test_y=raw.test_y)
        with contextlib.suppress(OSError, JimuError):  # a read-only home: no cache, no harm
            atomic_write_bytes(cache, buffer.getvalue())
    return raw


def _split(seed: int) -> RawData:
    """The split as scikit-learn makes it."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    tr_x, te_x, tr_y, te_y = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return RawData(tr_x, tr_y, te_x, te_y, num_classes=10)
