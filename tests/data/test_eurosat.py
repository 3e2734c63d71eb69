"""eurosat and eurosat-ms on generated archives: classes, pixels, split, bad archives, download."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from datafiles import Server, md5
from geofiles import MS_ROOT, eurosat_zip, ms_tiff, rgb_jpeg

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data import download as dl
from deepjimu.data.eurosat import CLASSES
from deepjimu.errors import JimuError

# images per class of the generated RGB archive: 5 of AnnualCrop, 10 of Forest, 2 of SeaLake
PER_CLASS = {"AnnualCrop": 5, "Forest": 10, "SeaLake": 2}


def _colour(c: int, i: int) -> tuple[int, int, int]:
    return (20 * c, 10 * i, 200)


def _rgb_archive(per_class: dict[str, int] = PER_CLASS) -> bytes:
    members = {}
    for name, n in per_class.items():
        c = CLASSES.index(name)
        for i in range(n):
            members[f"2750/{name}/{name}_{i + 1}.jpg"] = rgb_jpeg(_colour(c, i))
    return eurosat_zip(members)


def _ms_pixels(c: int, i: int) -> np.ndarray:
    return np.full((64, 64, 13), 1000 * c + i, np.uint16) + np.arange(13, dtype=np.uint16)


def _ms_archive(planar: bool = False) -> bytes:
    members = {}
    for name, n in (("Highway", 3), ("River", 2)):
        c = CLASSES.index(name)
        for i in range(n):
            members[f"{MS_ROOT}/{name}/{name}_{i + 1}.tif"] = ms_tiff(_ms_pixels(c, i), planar)
    return eurosat_zip(members)


def _put(root: Path, name: str, archive: str, data: bytes) -> Path:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / archive).write_bytes(data)
    return root / name / archive


def _error(name: str, opts: DataOptions) -> str:
    with pytest.raises(JimuError) as err:
        load_dataset(name, opts)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_rgb_archive(tmp_path: Path) -> None:
    _put(tmp_path, "eurosat", "EuroSAT.zip", _rgb_archive())
    d = load_dataset("eurosat", DataOptions(data_dir=tmp_path, val_fraction=0))
    assert d.num_classes == 10 and d.feature_shape == (3, 64, 64)
    # 80% of each class trains: 4 of 5, 8 of 10, and of 2 one (at least one in each split)
    assert np.bincount(d.train_y.numpy(), minlength=10)[[0, 1, 9]].tolist() == [4, 8, 1]
    assert np.bincount(d.test_y.numpy(), minlength=10)[[0, 1, 9]].tolist() == [1, 2, 1]
    # the pixels: each image's flat colour / 255 (JPEG keeps it within a level or two)
    means = d.test_x.mean((2, 3)).numpy() * 255
    colours = {_colour(c, i) for c, n in ((0, 5), (1, 10), (9, 2)) for i in range(n)}
    for m, c in zip(means, d.test_y.tolist(), strict=True):
        near = min(colours, key=lambda k: np.abs(np.subtract(k, m)).max())
        assert np.abs(np.subtract(near, m)).max() < 3 and near[0] == 20 * c
    assert d.test_x.min() >= 0 and d.test_x.max() <= 1


def test_split_follows_seed_and_fraction(tmp_path: Path) -> None:
    _put(tmp_path, "eurosat", "EuroSAT.zip", _rgb_archive())
    opts = DataOptions(data_dir=tmp_path, val_fraction=0, train_fraction=0.5, seed=1)
    a, b = load_dataset("eurosat", opts), load_dataset("eurosat", opts)
    assert np.bincount(a.train_y.numpy(), minlength=10)[[0, 1, 9]].tolist() == [2, 5, 1]
    assert np.array_equal(a.test_x, b.test_x)
    c = load_dataset("eurosat", DataOptions(data_dir=tmp_path, val_fraction=0, seed=2))
    d = load_dataset("eurosat", DataOptions(data_dir=tmp_path, val_fraction=0, seed=3))
    assert not np.array_equal(c.test_x, d.test_x)


@pytest.mark.parametrize("planar", [False, True], ids=["bands-last", "bands-first"])
def test_ms_archive(tmp_path: Path, planar: bool) -> None:
    _put(tmp_path, "eurosat-ms", "EuroSATallBands.zip", _ms_archive(planar))
    d = load_dataset("eurosat-ms", DataOptions(data_dir=tmp_path, val_fraction=0))
    assert d.feature_shape == (13, 64, 64)
    assert sorted([*d.train_y.tolist(), *d.test_y.tolist()]) == [3, 3, 3, 8, 8]
    # digital numbers / 10,000, band by band, exactly
    for x, y in zip(d.test_x.numpy(), d.test_y.tolist(), strict=True):
        i = round(float(x[0, 0, 0]) * 10000) - 1000 * y
        expect = _ms_pixels(y, i).transpose(2, 0, 1).astype(np.float32) / np.float32(10000)
        np.testing.assert_array_equal(x, expect)


def test_missing_archive_says_download(tmp_path: Path) -> None:
    assert _error("eurosat-ms", DataOptions(data_dir=tmp_path)) == (
        f"eurosat-ms: missing file {tmp_path}/eurosat-ms/EuroSATallBands.zip; "
        "run with --download to fetch it"
    )


def test_damaged_archive_is_one_line(tmp_path: Path) -> None:
    data = _rgb_archive()
    path = _put(tmp_path, "eurosat", "EuroSAT.zip", data[: len(data) // 2])
    msg = _error("eurosat", DataOptions(data_dir=tmp_path))
    assert msg.startswith(f"{path}: damaged zip archive (BadZipFile: ")


def test_damaged_image_is_one_line(tmp_path: Path) -> None:
    jpeg = rgb_jpeg((1, 2, 3))
    archive = eurosat_zip({"2750/Forest/Forest_1.jpg": jpeg[:40]})
    path = _put(tmp_path, "eurosat", "EuroSAT.zip", archive)
    msg = _error("eurosat", DataOptions(data_dir=tmp_path))
    assert msg.startswith(f"{path}: 2750/Forest/Forest_1.jpg is not a readable image (")


def test_wrong_shape_is_one_line(tmp_path: Path) -> None:
    archive = eurosat_zip({"2750/River/River_7.jpg": rgb_jpeg((1, 2, 3), side=32)})
    path = _put(tmp_path, "eurosat", "EuroSAT.zip", archive)
    assert _error("eurosat", DataOptions(data_dir=tmp_path)) == (
        f"{path}: 2750/River/River_7.jpg has shape (3, 32, 32); EuroSAT images are 3 x 64 x 64"
    )
    ms = eurosat_zip({f"{MS_ROOT}/River/River_1.tif": ms_tiff(np.zeros((64, 64, 12), np.uint16))})
    path = _put(tmp_path, "eurosat-ms", "EuroSATallBands.zip", ms)
    msg = _error("eurosat-ms", DataOptions(data_dir=tmp_path))
    assert msg.startswith(f"{path}: {MS_ROOT}/River/River_1.tif has shape (64, 64, 12); ")


def test_unknown_class_folder_is_one_line(tmp_path: Path) -> None:
    archive = eurosat_zip({"2750/Glacier/Glacier_1.jpg": rgb_jpeg((1, 2, 3))})
    path = _put(tmp_path, "eurosat", "EuroSAT.zip", archive)
    msg = _error("eurosat", DataOptions(data_dir=tmp_path))
    assert msg.startswith(f"{path}: 2750/Glacier/Glacier_1.jpg is in no class folder (")


def test_download_verifies_the_checksum(
    tmp_path: Path, http_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _rgb_archive()
    source = dl.Source("http://127.0.0.1:9/unused/", {"EuroSAT.zip": md5(archive)})
    monkeypatch.setitem(dl.SOURCES, "eurosat", source)
    http_server.serve({"EuroSAT.zip": archive}, prefix="/m")
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url + "/m")
    d = load_dataset("eurosat", opts)
    assert d.train_size + len(d.val_y) + len(d.test_y) == 17
    assert (tmp_path / "eurosat" / "EuroSAT.zip").read_bytes() == archive
    # the official MD5 refuses any other file, and nothing is left behind
    http_server.serve({"EuroSATallBands.zip": _ms_archive()})
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url)
    msg = _error("eurosat-ms", opts)
    assert "checksum mismatch" in msg and "5ac12b3b2557aa56e1826e981e8e200e" in msg
    assert list((tmp_path / "eurosat-ms").iterdir()) == []
