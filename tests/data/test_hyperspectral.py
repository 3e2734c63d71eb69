"""indian-pines and pavia-u on generated .mat scenes: samples, split, windows, bad files, download."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from datafiles import Server
from geofiles import Scene, make_scene

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data.download import source_url
from deepjimu.data.hyperspectral import SCENES, scene_split, windows
from deepjimu.errors import JimuError

IP = SCENES["indian-pines"]
IP_FILES = (IP.cube_file, IP.cube_key, IP.gt_file, IP.gt_key)
# classes 1, 2, 3 and 9 of Indian Pines, with 30, 20, 10 and 2 labelled pixels
COUNTS = {1: 30, 2: 20, 3: 10, 9: 2}


@pytest.fixture
def scene() -> Scene:
    return make_scene(COUNTS)


def _write(scene: Scene, root: Path, name: str = "indian-pines") -> Path:
    s = SCENES[name]
    scene.write(root / name, (s.cube_file, s.cube_key, s.gt_file, s.gt_key))
    return root


def _error(opts: DataOptions, name: str = "indian-pines") -> str:
    with pytest.raises(JimuError) as err:
        load_dataset(name, opts)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_labelled_pixels_become_samples(tmp_path: Path, scene: Scene) -> None:
    d = load_dataset("indian-pines", DataOptions(data_dir=_write(scene, tmp_path), val_fraction=0))
    assert d.num_classes == 16 and d.feature_shape == (6,)
    assert d.train_size + len(d.test_y) == sum(COUNTS.values())
    # the file's classes 1..16 are 0..15; 10% of each class trains (at least 1, not all)
    train = np.bincount(d.train_y.numpy(), minlength=16)
    test = np.bincount(d.test_y.numpy(), minlength=16)
    assert {c: int(train[c - 1]) for c in COUNTS} == {1: 3, 2: 2, 3: 1, 9: 1}
    assert {c: int(test[c - 1]) for c in COUNTS} == {1: 27, 2: 18, 3: 9, 9: 1}
    # bands standardised with the training pixels' statistics
    np.testing.assert_allclose(d.train_x.mean(0).numpy(), 0, atol=1e-5)
    np.testing.assert_allclose(d.train_x.std(0, unbiased=False).numpy(), 1, atol=1e-4)
    # each sample is its pixel's spectrum, scaled by the training pixels' mean and std
    train_px, test_px = scene_split(scene.gt, 0.1, seed=0)
    flat = scene.cube.reshape(-1, 6).astype(np.float64)
    mean, std = flat[train_px].mean(0), flat[train_px].std(0)
    np.testing.assert_allclose(d.test_x.numpy(), (flat[test_px] - mean) / std, atol=1e-4)
    np.testing.assert_array_equal(d.test_y.numpy(), scene.gt.ravel()[test_px] - 1)


def test_split_follows_seed_and_fraction(tmp_path: Path, scene: Scene) -> None:
    root = _write(scene, tmp_path)
    a = load_dataset("indian-pines", DataOptions(data_dir=root, seed=1, val_fraction=0))
    b = load_dataset("indian-pines", DataOptions(data_dir=root, seed=1, val_fraction=0))
    c = load_dataset("indian-pines", DataOptions(data_dir=root, seed=2, val_fraction=0))
    assert np.array_equal(a.test_x, b.test_x) and not np.array_equal(a.test_x, c.test_x)
    half = load_dataset("indian-pines", DataOptions(data_dir=root, train_fraction=0.5))
    counts = np.bincount(np.concatenate([half.train_y, half.val_y]), minlength=16)
    assert {c: int(counts[c - 1]) for c in COUNTS} == {1: 15, 2: 10, 3: 5, 9: 1}


def test_patch_gives_windows(tmp_path: Path, scene: Scene) -> None:
    root = _write(scene, tmp_path)
    flat = load_dataset("indian-pines", DataOptions(data_dir=root, seed=5, val_fraction=0))
    d = load_dataset("indian-pines", DataOptions(data_dir=root, seed=5, patch=3, val_fraction=0))
    assert d.feature_shape == (6, 3, 3)
    # the window's centre is the pixel's spectrum
    np.testing.assert_allclose(d.test_x[:, :, 1, 1].numpy(), flat.test_x.numpy())
    with pytest.raises(JimuError, match=r"patch must be 0 or an odd window size \(patch: 4\)"):
        load_dataset("indian-pines", DataOptions(data_dir=root, patch=4))


def test_windows_read_zeros_outside_the_scene() -> None:
    cube = np.arange(4 * 5 * 2, dtype=np.float32).reshape(4, 5, 2)
    w = windows(cube, np.array([0, 7, 19]), 3)  # corner (0, 0), inside (1, 2), corner (3, 4)
    assert w.shape == (3, 2, 3, 3)
    np.testing.assert_array_equal(w[1, :, :, :], cube[0:3, 1:4].transpose(2, 0, 1))
    assert (w[0, :, 0, :] == 0).all() and (w[0, :, :, 0] == 0).all()
    np.testing.assert_array_equal(w[0, :, 1:, 1:], cube[0:2, 0:2].transpose(2, 0, 1))
    assert (w[2, :, 2, :] == 0).all() and (w[2, :, :, 2] == 0).all()


def test_pavia_u(tmp_path: Path) -> None:
    scene = make_scene({1: 8, 9: 4}, shape=(6, 7, 5))
    d = load_dataset("pavia-u", DataOptions(data_dir=_write(scene, tmp_path, "pavia-u")))
    assert d.num_classes == 9 and d.feature_shape == (5,)
    assert set(d.test_y.tolist()) == {0, 8}


def test_missing_file_says_download(tmp_path: Path) -> None:
    msg = _error(DataOptions(data_dir=tmp_path))
    assert msg == (
        f"indian-pines: missing file {tmp_path}/indian-pines/Indian_pines_corrected.mat; "
        "run with --download to fetch it"
    )


def test_damaged_file_is_one_line(tmp_path: Path, scene: Scene) -> None:
    cube = _write(scene, tmp_path) / "indian-pines" / IP.cube_file
    cube.write_bytes(cube.read_bytes()[:300])
    msg = _error(DataOptions(data_dir=tmp_path))
    assert msg.startswith(f"{cube}: not a readable MATLAB file (")


def test_wrong_shape_is_one_line(tmp_path: Path, scene: Scene) -> None:
    _write(Scene(scene.cube, scene.gt[:, :-1]), tmp_path)
    msg = _error(DataOptions(data_dir=tmp_path))
    assert msg == (
        f"{tmp_path}/indian-pines/Indian_pines_gt.mat: ground truth of 12x9 pixels, "
        "but the cube Indian_pines_corrected.mat has 12x10"
    )
    _write(Scene(scene.cube[:, :, 0], scene.gt), tmp_path)
    msg = _error(DataOptions(data_dir=tmp_path))
    assert msg == (
        f"{tmp_path}/indian-pines/Indian_pines_corrected.mat: 'indian_pines_corrected' must be "
        "a 3-D numeric array (got uint16 array of shape (12, 10))"
    )


def test_wrong_variable_and_class_are_one_line(tmp_path: Path, scene: Scene) -> None:
    scene.write(tmp_path / "indian-pines", (IP.cube_file, "paviaU", IP.gt_file, IP.gt_key))
    msg = _error(DataOptions(data_dir=tmp_path))
    assert msg.endswith("Indian_pines_corrected.mat: has no variable 'indian_pines_corrected' "
                        "(variables: paviaU)")  # fmt: skip
    gt = scene.gt.copy()
    gt[2, 3] = 17
    _write(Scene(scene.cube, gt), tmp_path)
    msg = _error(DataOptions(data_dir=tmp_path))
    assert msg.endswith("Indian_pines_gt.mat: class 17 at pixel (2, 3) out of range 0..16 "
                        "(0: no label)")  # fmt: skip


def test_official_urls() -> None:
    assert source_url("indian-pines", "Indian_pines_gt.mat") == (
        "https://www.ehu.eus/ccwintco/uploads/c/c4/Indian_pines_gt.mat"
    )
    assert source_url("pavia-u", "PaviaU.mat") == (
        "https://www.ehu.eus/ccwintco/uploads/e/ee/PaviaU.mat"
    )
    # a mirror serves every file under its name
    assert source_url("pavia-u", "PaviaU.mat", "http://m/x/") == "http://m/x/PaviaU.mat"


def test_download_checks_the_format(tmp_path: Path, http_server: Server) -> None:
    # no published checksum: a download must hold its variable at the official size
    scene = make_scene({1: 40, 16: 12}, shape=IP.shape)
    files = {IP.cube_file: scene.mat_bytes(IP.cube_key, "cube")}
    files[IP.gt_file] = scene.mat_bytes(IP.gt_key, "gt")
    http_server.serve(files, prefix="/ehu")
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url + "/ehu")
    d = load_dataset("indian-pines", opts)
    assert d.feature_shape == (200,) and len(d.test_y) + d.train_size + len(d.val_y) == 52
    assert sorted(p.name for p in (tmp_path / "indian-pines").iterdir()) == [
        IP.cube_file,
        IP.gt_file,
    ]
    assert (tmp_path / "indian-pines" / IP.gt_file).read_bytes() == files[IP.gt_file]


def test_download_of_a_wrong_file_leaves_nothing(tmp_path: Path, http_server: Server) -> None:
    small = make_scene({1: 5})
    http_server.serve({IP.cube_file: small.mat_bytes(IP.cube_key, "cube")})
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url)
    msg = _error(opts)
    assert msg == (
        f"{tmp_path}/indian-pines/Indian_pines_corrected.mat: downloaded "
        "'indian_pines_corrected' is 12x10x6, the official file's is 145x145x200"
    )
    assert list((tmp_path / "indian-pines").iterdir()) == []
    http_server.serve({IP.cube_file: b"<html>not found</html>"})
    msg = _error(opts)
    assert "Indian_pines_corrected.mat: not a readable MATLAB file" in msg
    assert list((tmp_path / "indian-pines").iterdir()) == []
