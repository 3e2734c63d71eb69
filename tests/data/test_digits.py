"""The digits split, made by scikit-learn once and kept between processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deepjimu.data import DataOptions
from deepjimu.data.digits import _split, load_digits_raw, split_cache


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _same(a: object, b: object) -> None:
    for k in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))


def test_the_kept_split_is_scikit_learns_and_is_read_back(cache_home: Path) -> None:
    made = _split(3)
    first = load_digits_raw(DataOptions(seed=3))  # made and kept
    cache = split_cache(3)
    assert cache is not None and cache.is_file() and cache.is_relative_to(cache_home)
    _same(first, made)
    stamp = cache.stat().st_mtime_ns
    again = load_digits_raw(DataOptions(seed=3))
    _same(again, made)
    assert cache.stat().st_mtime_ns == stamp  # read, not written again
    assert split_cache(4) != cache  # each seed its own split
    assert (len(made.train_x), len(made.test_x)) == (1437, 360)


def test_a_corrupt_or_unwritable_cache_only_means_the_split_is_made_again(
    cache_home: Path,
) -> None:
    cache = split_cache(0)
    assert cache is not None
    cache.parent.mkdir(parents=True)
    cache.write_bytes(b"PK\x03\x04 not a whole archive")
    _same(load_digits_raw(DataOptions(seed=0)), _split(0))
    assert np.load(cache)["x"].shape == (1437, 1, 8, 8)  # made again, whole
    cache.unlink()
    cache.parent.chmod(0o500)  # root writes anyway; a user could not: both must load
    try:
        _same(load_digits_raw(DataOptions(seed=0)), _split(0))
    finally:
        cache.parent.chmod(0o700)
    assert not [p for p in cache.parent.iterdir() if p.name.startswith(".")]  # no half file
