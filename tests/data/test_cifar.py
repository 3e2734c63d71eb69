"""CIFAR-10 pickle batches: loading, safe extraction of the tarball, and one-line errors."""

from __future__ import annotations

import io
import itertools
import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from datafiles import CIFAR_BATCHES, CifarSet, add_tar_file, py2_batch_bytes

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data.download import extract_tar
from deepjimu.errors import JimuError

BATCHES = "cifar-10-batches-py"


def test_load_cifar10(tmp_path: Path, cifar_set: CifarSet) -> None:
    cifar_set.write(tmp_path / "cifar10" / BATCHES)
    d = load_dataset("cifar10", DataOptions(data_dir=tmp_path, val_fraction=0.2))
    assert d.feature_shape == (3, 32, 32) and d.num_classes == 10
    assert d.train_x.shape == (16, 3, 32, 32) and d.val_x.shape == (4, 3, 32, 32)
    assert d.test_x.shape == (4, 3, 32, 32)
    assert str(d.train_x.dtype) == "torch.float32" and str(d.train_y.dtype) == "torch.int64"
    assert float(d.train_x.min()) >= 0.0 and float(d.train_x.max()) <= 1.0
    # channel-major layout: the first 1024 values of a row are the red plane
    expect = cifar_set.data["test_batch"].reshape(-1, 3, 32, 32).astype(np.float32) / 255
    np.testing.assert_allclose(d.test_x.numpy(), expect, atol=1e-7)
    np.testing.assert_array_equal(d.test_y.numpy(), cifar_set.labels["test_batch"])
    all_y = sorted(np.concatenate([d.train_y.numpy(), d.val_y.numpy()]).tolist())
    assert all_y == sorted(itertools.chain(*(cifar_set.labels[b] for b in CIFAR_BATCHES[:5])))


def test_str_keys_accepted(tmp_path: Path, cifar_set: CifarSet) -> None:
    folder = cifar_set.write(tmp_path / "cifar10" / BATCHES)
    batch = {"data": cifar_set.data["test_batch"], "labels": cifar_set.labels["test_batch"]}
    (folder / "test_batch").write_bytes(pickle.dumps(batch, protocol=4))
    d = load_dataset("cifar10", DataOptions(data_dir=tmp_path))
    np.testing.assert_array_equal(d.test_y.numpy(), cifar_set.labels["test_batch"])


def test_python2_pickle_layout(tmp_path: Path, cifar_set: CifarSet) -> None:
    folder = cifar_set.write(tmp_path / "cifar10" / BATCHES)
    data, labels = cifar_set.data["test_batch"], cifar_set.labels["test_batch"]
    (folder / "test_batch").write_bytes(py2_batch_bytes(data, labels))
    d = load_dataset("cifar10", DataOptions(data_dir=tmp_path))
    expect = data.reshape(-1, 3, 32, 32).astype(np.float32) / 255
    np.testing.assert_allclose(d.test_x.numpy(), expect, atol=1e-7)
    np.testing.assert_array_equal(d.test_y.numpy(), labels)


def test_local_tarball_is_extracted(tmp_path: Path, cifar_set: CifarSet) -> None:
    root = tmp_path / "cifar10"
    root.mkdir()
    (root / "cifar-10-python.tar.gz").write_bytes(cifar_set.tarball())
    d = load_dataset("cifar10", DataOptions(data_dir=tmp_path))
    assert d.test_x.shape == (4, 3, 32, 32)
    assert sorted(p.name for p in (root / BATCHES).iterdir()) == sorted(CIFAR_BATCHES)
    assert sorted(p.name for p in root.iterdir()) == [BATCHES, "cifar-10-python.tar.gz"]


def test_partial_folder_is_not_overwritten(tmp_path: Path, cifar_set: CifarSet) -> None:
    root = tmp_path / "cifar10"
    (cifar_set.write(root / BATCHES) / "data_batch_4").unlink()
    (root / "cifar-10-python.tar.gz").write_bytes(cifar_set.tarball())
    with pytest.raises(JimuError, match=r"data_batch_4, and extracting .* did not restore it"):
        load_dataset("cifar10", DataOptions(data_dir=tmp_path))
    assert sorted(p.name for p in root.iterdir()) == [BATCHES, "cifar-10-python.tar.gz"]


def _tarball(tmp_path: Path, members: Callable[[tarfile.TarFile], None]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        members(tar)
    p = tmp_path / "a.tar.gz"
    p.write_bytes(buf.getvalue())
    return p


def _symlink(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo(f"{BATCHES}/data_batch_1")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    tar.addfile(info)


@pytest.mark.parametrize(
    "members, bad",
    [
        (lambda t: add_tar_file(t, f"{BATCHES}/../../evil", b"x"), "../../evil"),
        (lambda t: add_tar_file(t, "/tmp/evil", b"x"), "/tmp/evil"),
        (lambda t: add_tar_file(t, "elsewhere/evil", b"x"), "elsewhere/evil"),
        (_symlink, "data_batch_1"),
    ],
    ids=["dotdot", "absolute", "outside-top", "symlink"],
)
def test_extract_refuses_unsafe_members(
    tmp_path: Path, members: Callable[[tarfile.TarFile], None], bad: str
) -> None:
    def with_good_first(tar: tarfile.TarFile) -> None:
        add_tar_file(tar, f"{BATCHES}/test_batch", b"ok")
        members(tar)

    archive = _tarball(tmp_path, with_good_first)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(JimuError, match="refusing unsafe") as err:
        extract_tar(archive, dest, BATCHES)
    assert bad in str(err.value) and str(archive) in str(err.value)
    assert list(dest.iterdir()) == []  # nothing extracted, no temporary folder left
    assert not (tmp_path / "evil").exists()


def test_extract_corrupt_archive(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(b"\x1f\x8b not really gzip")
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(JimuError, match="cannot be extracted"):
        extract_tar(archive, dest, BATCHES)
    assert list(dest.iterdir()) == []


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def _pickle(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=2)


def _batch(s: CifarSet, **over: object) -> bytes:
    batch: dict[bytes, object] = {
        b"data": s.data["data_batch_2"],
        b"labels": s.labels["data_batch_2"],
    }
    batch.update({k.encode(): v for k, v in over.items()})
    return _pickle(batch)


BAD_CASES: dict[str, tuple[Callable[[CifarSet], bytes], str]] = {
    "truncated": (lambda s: _batch(s)[:-40], "not a readable pickle batch"),
    "garbage": (lambda s: b"\x00garbage", "not a readable pickle batch"),
    "code in pickle": (lambda s: _pickle({b"data": _Evil()}), "print is not allowed"),
    "not a dict": (lambda s: _pickle([1, 2, 3]), "not a CIFAR batch"),
    "missing key": (lambda s: _pickle({b"data": s.data["data_batch_2"]}), "missing key 'labels'"),
    "wrong dims": (lambda s: _batch(s, data=s.data["data_batch_2"][:, :3000]), "wrong dims"),
    "not uint8": (lambda s: _batch(s, data=s.data["data_batch_2"] * 1.0), "must be a uint8"),
    "label out of range": (
        lambda s: _batch(s, labels=[0, 1, 10, 2]),
        "label 10 at index 2 out of range",
    ),
    "count mismatch": (lambda s: _batch(s, labels=[0, 1, 2]), "4 images but 3 labels"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_batch_is_one_line_error(
    tmp_path: Path, cifar_set: CifarSet, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make, problem = BAD_CASES[case]
    folder = cifar_set.write(tmp_path / "cifar10" / BATCHES)
    (folder / "data_batch_2").write_bytes(make(cifar_set))
    with pytest.raises(JimuError) as err:
        load_dataset("cifar10", DataOptions(data_dir=tmp_path))
    msg = str(err.value).replace(str(tmp_path), "<tmp>")  # the problem, not the test name
    assert "\n" not in msg
    assert f"<tmp>/cifar10/{BATCHES}/data_batch_2:" in msg and problem in msg
    assert "pwned" not in capsys.readouterr().out


def test_missing_batch(tmp_path: Path, cifar_set: CifarSet) -> None:
    folder = cifar_set.write(tmp_path / "cifar10" / BATCHES)
    (folder / "data_batch_3").unlink()
    with pytest.raises(JimuError) as err:
        load_dataset("cifar10", DataOptions(data_dir=tmp_path))
    msg = str(err.value).replace(str(tmp_path), "<tmp>")  # the problem, not the test name
    assert "\n" not in msg and "missing file" in msg and "--download" in msg
    assert f"<tmp>/cifar10/{BATCHES}/data_batch_3" in msg
