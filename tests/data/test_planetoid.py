"""Planetoid files: node numbering, the test-index gap, both splits, refused pickles, bad files, downloads."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from datafiles import Server, md5
from graphfiles import PlanetoidSet, make_planetoid_set

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data import download as dl
from deepjimu.data.planetoid import FILES
from deepjimu.errors import JimuError

REAL = Path("/work/shared/data")


@pytest.fixture
def tiny() -> PlanetoidSet:
    return make_planetoid_set()


def _raw_rows(tmp_path: Path, tiny: PlanetoidSet, **kw: object) -> DataOptions:
    """Options that keep each row the node's raw features (no propagation, no scaling)."""
    tiny.write(tmp_path)
    return DataOptions(data_dir=tmp_path, graph_hops=0, graph_row_norm=False, **kw)


def test_public_split_and_gap(tmp_path: Path, tiny: PlanetoidSet) -> None:
    d = load_dataset("citeseer", _raw_rows(tmp_path, tiny, node_level=True))
    g = d.graph
    assert g is not None and d.num_classes == 3 and d.feature_shape == (6,)
    assert len(g.y) == 23 and tiny.gaps == [20]
    # the gap node: a zero row, no label, in no split; it stays in the graph, isolated
    assert float(g.x[20].abs().sum()) == 0 and int(g.y[20]) == -1
    assert g.train_idx.tolist() == list(range(6)) and g.val_idx.tolist() == list(range(6, 16))
    assert g.test_idx.tolist() == sorted(tiny.test_index) and 20 not in g.test_idx
    # each test row is the node that the test index names, not the row's file position
    np.testing.assert_array_equal(g.x.numpy(), tiny.features)
    np.testing.assert_array_equal(d.test_x.numpy(), tiny.features[sorted(tiny.test_index)])
    np.testing.assert_array_equal(d.test_y.numpy(), tiny.labels[sorted(tiny.test_index)])
    np.testing.assert_array_equal(d.val_y.numpy(), tiny.labels[6:16])
    assert d.train_size == 6 and torch.bincount(d.train_y).tolist() == [2, 2, 2]
    # A_hat: the ring over the 22 other nodes plus the link 0-5; self loops only from + I
    adj = g.adj.to_dense()
    assert int((adj > 0).sum()) == 2 * (22 + 1) + 23 and float(adj[20, 20]) == 1.0


def test_predefined_validation_ignores_val_fraction(tmp_path: Path, tiny: PlanetoidSet) -> None:
    d = load_dataset("citeseer", _raw_rows(tmp_path, tiny, val_fraction=0.5))
    assert len(d.val_y) == 10 and d.train_size == 6


def test_random_split(tmp_path: Path, tiny: PlanetoidSet) -> None:
    def split(seed: int) -> list[list[int]]:
        opts = _raw_rows(tmp_path, tiny, node_level=True, split="random", seed=seed)
        g = load_dataset("citeseer", opts).graph
        assert g is not None
        return [g.train_idx.tolist(), g.val_idx.tolist(), g.test_idx.tolist()]

    a, b = split(1), split(2)
    assert a == split(1) and a != b
    for s in (a, b):
        assert [len(x) for x in s] == [6, 10, 6]
        assert sorted(s[0] + s[1] + s[2]) == sorted(set(range(23)) - {20})
        assert np.bincount(tiny.labels[s[0]]).tolist() == [2, 2, 2]


def test_propagated_rows(tmp_path: Path, tiny: PlanetoidSet) -> None:
    tiny.write(tmp_path)
    base = load_dataset("citeseer", DataOptions(data_dir=tmp_path, graph_hops=0, node_level=True))
    g = base.graph
    assert g is not None
    np.testing.assert_allclose(g.x.sum(1)[g.y >= 0].numpy(), 1.0, rtol=1e-6)  # row-normalised
    d = load_dataset(
        "citeseer", DataOptions(data_dir=tmp_path, graph_hops=2, graph_features="concat")
    )
    adj = g.adj.to_dense()
    h = torch.cat([g.x, adj @ g.x, adj @ adj @ g.x], 1)
    assert d.feature_shape == (18,)
    np.testing.assert_allclose(d.test_x.numpy(), h[g.test_idx].numpy(), rtol=1e-6)
    np.testing.assert_allclose(d.train_x.numpy(), h[g.train_idx].numpy(), rtol=1e-6)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch pwned",))


def test_malicious_pickle_refused(
    tmp_path: Path, tiny: PlanetoidSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny.write(tmp_path)
    path = tmp_path / "planetoid" / "ind.citeseer.graph"
    path.write_bytes(pickle.dumps({0: _Evil()}, protocol=2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(JimuError) as err:
        load_dataset("citeseer", DataOptions(data_dir=tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "system is not allowed" in msg
    assert not (tmp_path / "pwned").exists()


def _csr_bytes(rows: np.ndarray) -> bytes:
    import scipy.sparse

    return pickle.dumps(scipy.sparse.csr_matrix(rows), protocol=2)


BAD: dict[str, tuple[str, Callable[[PlanetoidSet], bytes], str]] = {
    "truncated": ("allx", lambda s: s.file_bytes()["ind.citeseer.allx"][:-30], "not a readable"),
    "not a matrix": ("tx", lambda s: pickle.dumps([1, 2], protocol=2), "expected a feature matrix"),
    "feature width": ("tx", lambda s: _csr_bytes(s.features[:6, :4]), "4 features per node"),
    "label count": (
        "ty",
        lambda s: pickle.dumps(np.eye(3, dtype=np.int32)[[0, 1]], protocol=2),
        "2 labels for the 6 feature rows of tx",
    ),
    "two labels": (
        "ally",
        lambda s: pickle.dumps(np.ones((16, 3), np.int32), protocol=2),
        "row 0 has 3 labels",
    ),
    "test index text": ("test.index", lambda s: b"16\nseventeen\n", "line 2 is not a node id"),
    "test index count": ("test.index", lambda s: b"16\n17\n", "2 test nodes, but tx has 6"),
    "graph id": (
        "graph",
        lambda s: pickle.dumps({0: [99]}, protocol=2),
        "node id 99 out of range 0..22",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_is_one_line_naming_it(tmp_path: Path, tiny: PlanetoidSet, case: str) -> None:
    ext, body, expect = BAD[case]
    tiny.write(tmp_path)
    path = tmp_path / "planetoid" / f"ind.citeseer.{ext}"
    path.write_bytes(body(tiny))
    with pytest.raises(JimuError) as err:
        load_dataset("citeseer", DataOptions(data_dir=tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and expect in msg, msg


def test_missing_file_hints_download(tmp_path: Path, tiny: PlanetoidSet) -> None:
    tiny.write(tmp_path)
    (tmp_path / "planetoid" / "ind.citeseer.ty").unlink()
    with pytest.raises(JimuError, match=r"missing file .*ind\.citeseer\.ty; run with --download"):
        load_dataset("citeseer", DataOptions(data_dir=tmp_path))


def test_download_with_checksums(
    tmp_path: Path, tiny: PlanetoidSet, http_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny.name = "cora"
    files = tiny.file_bytes()
    monkeypatch.setitem(
        dl.SOURCES, "cora", dl.Source("http://127.0.0.1:9/", {n: md5(b) for n, b in files.items()})
    )
    http_server.serve(files)
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url)
    d = load_dataset("cora", opts)
    assert len(d.test_y) == 6 and sorted(http_server.hits) == sorted(f"/{n}" for n in files)
    for name, body in files.items():
        assert (tmp_path / "planetoid" / name).read_bytes() == body


def test_download_without_checksum_checks_format(
    tmp_path: Path, tiny: PlanetoidSet, http_server: Server
) -> None:
    files = tiny.file_bytes()
    files["ind.citeseer.graph"] = b"<html>not found</html>"
    http_server.serve(files)
    opts = DataOptions(data_dir=tmp_path, download=True, data_url=http_server.url)
    with pytest.raises(JimuError) as err:
        load_dataset("citeseer", opts)
    msg = str(err.value)
    dest = tmp_path / "planetoid" / "ind.citeseer.graph"
    assert "\n" not in msg and msg.startswith(f"{dest}: not a readable Planetoid pickle")
    # the files before it are whole and in place; the refused one left nothing behind
    left = sorted(p.name for p in (tmp_path / "planetoid").iterdir())
    assert left == sorted(f"ind.citeseer.{e}" for e in FILES[: FILES.index("graph")])


@pytest.mark.skipif(not (REAL / "planetoid").is_dir(), reason="no real Cora in ../shared/data")
def test_real_cora() -> None:
    d = load_dataset("cora", DataOptions(data_dir=REAL, node_level=True))
    g = d.graph
    assert g is not None and d.feature_shape == (1433,) and d.num_classes == 7
    assert [len(g.train_idx), len(g.val_idx), len(g.test_idx)] == [140, 500, 1000]
    assert len(g.y) == 2708 and d.info["graph_edges"] == 5278  # 10,556 directed, as PyG counts
    for name, digest in dl.SOURCES["cora"].md5.items():
        assert dl.file_md5(REAL / "planetoid" / name) == digest
