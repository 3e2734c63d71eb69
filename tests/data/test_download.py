"""--download against a local HTTP server: verified atomic writes, and nothing left after a failure."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
from datafiles import CIFAR_BATCHES, CifarSet, IdxSet, Server, md5

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data import download as dl
from deepjimu.data.cifar import ARCHIVE
from deepjimu.errors import JimuError


@pytest.fixture
def mnist_checksums(monkeypatch: pytest.MonkeyPatch, idx_set: IdxSet) -> dict[str, bytes]:
    """Register the generated mnist files' MD5s in place of the official ones; the files."""
    files = idx_set.file_bytes(gz=True)
    source = dl.Source("http://127.0.0.1:9/unused/", {n: md5(b) for n, b in files.items()})
    monkeypatch.setitem(dl.SOURCES, "mnist", source)
    return files


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def test_download_mnist(
    tmp_path: Path, http_server: Server, mnist_checksums: dict[str, bytes], idx_set: IdxSet
) -> None:
    http_server.serve(mnist_checksums, prefix="/mirror")
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url + "/mirror/")
    d = load_dataset("mnist", opts)
    np.testing.assert_array_equal(d.test_y.numpy(), idx_set.labels["test"])
    assert _files_under(tmp_path / "mnist") == sorted(mnist_checksums)
    for name, body in mnist_checksums.items():
        assert (tmp_path / "mnist" / name).read_bytes() == body
    assert sorted(http_server.hits) == sorted(f"/mirror/{n}" for n in mnist_checksums)
    # present files are not fetched again
    load_dataset("mnist", opts)
    assert len(http_server.hits) == len(mnist_checksums)


def test_download_fetches_only_missing_files(
    tmp_path: Path, http_server: Server, mnist_checksums: dict[str, bytes], idx_set: IdxSet
) -> None:
    idx_set.write(tmp_path / "mnist", gz=False)
    (tmp_path / "mnist" / "t10k-images-idx3-ubyte").unlink()
    http_server.serve(mnist_checksums)
    load_dataset("mnist", DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url))
    assert http_server.hits == ["/t10k-images-idx3-ubyte.gz"]


def test_checksum_mismatch_leaves_no_file(
    tmp_path: Path, http_server: Server, idx_set: IdxSet
) -> None:
    # no checksum fixture: the generated files cannot match the official MD5s
    http_server.serve(idx_set.file_bytes(gz=True))
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url)
    with pytest.raises(JimuError) as err:
        load_dataset("mnist", opts)
    msg = str(err.value).replace(str(tmp_path), "<tmp>")  # the problem, not the test name
    assert "\n" not in msg and "checksum mismatch" in msg
    assert "train-images-idx3-ubyte.gz" in msg and "f68b3c2dcbeaaa9fbdd348bbdeb94873" in msg
    assert _files_under(tmp_path / "mnist") == []


@pytest.mark.parametrize("mode", ["short", "cut"])
def test_interrupted_transfer_leaves_no_file(
    tmp_path: Path, http_server: Server, mnist_checksums: dict[str, bytes], mode: str
) -> None:
    http_server.serve(mnist_checksums, mode=mode)
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url)
    with pytest.raises(JimuError) as err:
        load_dataset("mnist", opts)
    msg = str(err.value).replace(str(tmp_path), "<tmp>")  # the problem, not the test name
    assert "\n" not in msg and "was interrupted (got" in msg and "train-images-idx3-ubyte.gz" in msg
    assert _files_under(tmp_path / "mnist") == []


def test_http_404_is_one_line(tmp_path: Path, http_server: Server) -> None:
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url + "/nothing")
    with pytest.raises(JimuError) as err:
        load_dataset("fashion-mnist", opts)
    msg = str(err.value).replace(str(tmp_path), "<tmp>")  # the problem, not the test name
    assert "\n" not in msg
    assert f"{http_server.url}/nothing/train-images-idx3-ubyte.gz" in msg and "HTTP 404" in msg
    assert _files_under(tmp_path / "fashion-mnist") == []


def test_connection_refused_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=f"http://127.0.0.1:{port}")
    with pytest.raises(JimuError) as err:
        load_dataset("kmnist", opts)
    msg = str(err.value).replace(str(tmp_path), "<tmp>")  # the problem, not the test name
    assert "\n" not in msg and "download of" in msg and "failed" in msg
    assert _files_under(tmp_path / "kmnist") == []


def test_download_cifar10(
    tmp_path: Path, http_server: Server, cifar_set: CifarSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    tarball = cifar_set.tarball()
    monkeypatch.setitem(
        dl.SOURCES, "cifar10", dl.Source("http://127.0.0.1:9/", {ARCHIVE: md5(tarball)})
    )
    http_server.serve({ARCHIVE: tarball})
    d = load_dataset(
        "cifar10", DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url)
    )
    assert d.test_x.shape == (4, 3, 32, 32)
    root = tmp_path / "cifar10"
    assert (root / ARCHIVE).read_bytes() == tarball
    expect = [ARCHIVE, "cifar-10-batches-py"] + [f"cifar-10-batches-py/{b}" for b in CIFAR_BATCHES]
    assert _files_under(root) == sorted(expect)


def test_cifar10_checksum_mismatch(
    tmp_path: Path, http_server: Server, cifar_set: CifarSet
) -> None:
    http_server.serve({ARCHIVE: cifar_set.tarball()})
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url)
    with pytest.raises(JimuError, match=r"cifar-10-python\.tar\.gz: checksum mismatch"):
        load_dataset("cifar10", opts)
    assert _files_under(tmp_path / "cifar10") == []


def test_source_url() -> None:
    assert dl.source_url("mnist", "a.gz") == "https://ossci-datasets.s3.amazonaws.com/mnist/a.gz"
    assert dl.source_url("mnist", "a.gz", "http://m/x/") == "http://m/x/a.gz"
