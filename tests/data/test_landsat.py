"""landsat-spectra: the real file of the installed spyndex, and stand-in packages for bad files."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from geofiles import fake_spyndex

from deepjimu.data import DataOptions, load_dataset
from deepjimu.data.landsat import BANDS, INSTALL, read_spectra, spectra_file
from deepjimu.errors import JimuError


def test_the_real_file() -> None:
    # spyndex is in the dev extra (through geo): make test reads the real 120 samples
    x, y = read_spectra(spectra_file())
    assert x.shape == (120, 8) and np.bincount(y).tolist() == [37, 46, 37]  # Urban, Veg., Water
    assert "spyndex" not in sys.modules  # found, read, never imported
    d = load_dataset("landsat-spectra", DataOptions(val_fraction=0))
    assert d.num_classes == 3 and d.feature_shape == (8,)
    # half of each class trains (round half to even: 18 of 37), the rest tests
    assert np.bincount(d.train_y.numpy()).tolist() == [18, 23, 18]
    assert np.bincount(d.test_y.numpy()).tolist() == [19, 23, 19]
    np.testing.assert_allclose(d.train_x.mean(0).numpy(), 0, atol=1e-5)
    # with the default validation share: 6 of the 59 training samples validate
    d = load_dataset("landsat-spectra", DataOptions(seed=2))
    assert (d.train_size, len(d.val_y), len(d.test_y)) == (53, 6, 61)


def _table(n: int = 6) -> dict[str, Any]:
    rows = [str(i) for i in range(n)]
    table: dict[str, Any] = {b: {r: 0.1 * j + int(r) for r in rows} for j, b in enumerate(BANDS)}
    table["class"] = {r: ("Urban", "Vegetation", "Water")[int(r) % 3] for r in rows}
    return table


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[object], Path]:
    """Install a stand-in spyndex holding a given table; returns its spectral.json."""

    def install(table: object) -> Path:
        root = fake_spyndex(tmp_path / "site", table)
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.delitem(sys.modules, "spyndex", raising=False)
        importlib.invalidate_caches()
        return root / "spyndex" / "data" / "spectral.json"

    return install


def test_stand_in_file(stand_in: Callable[[object], Path]) -> None:
    path = stand_in(_table())
    assert spectra_file() == path
    x, y = read_spectra(path)
    assert y.tolist() == [0, 1, 2, 0, 1, 2]
    np.testing.assert_allclose(x[:, 1], np.arange(6) + 0.1)


def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "spyndex" else find(name, *a)
    )
    with pytest.raises(JimuError) as err:
        load_dataset("landsat-spectra")
    assert str(err.value) == INSTALL
    assert INSTALL == "landsat-spectra needs the spyndex package: pip install 'deepjimu[geo]'"


def _bad(table: dict[str, Any], key: str, value: object) -> dict[str, Any]:
    out = {k: dict(v) for k, v in table.items()}
    if value is None:
        del out[key]
    else:
        out[key]["3"] = value
    return out


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("{not json", "not a JSON file (Expecting property name"),
        ([1, 2], "expected a table (column -> rows), got list"),
        (_bad(_table(), "SR_B4", None), "no column 'SR_B4' of rows (columns: SR_B1, SR_B2,"),
        (_bad(_table(), "SR_B2", "dark"), "SR_B2 of row 3 is not a finite number ('dark')"),
        (_bad(_table(), "class", "Cloud"), "class 'Cloud' of row 3 is not one of Urban, Veg"),
    ],
    ids=["not-json", "not-a-table", "no-column", "not-a-number", "unknown-class"],
)
def test_damaged_file_is_one_line(
    stand_in: Callable[[object], Path], table: object, message: str
) -> None:
    path = stand_in(table)
    with pytest.raises(JimuError) as err:
        load_dataset("landsat-spectra")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: {message}")


def test_rows_must_agree(stand_in: Callable[[object], Path]) -> None:
    table = _table()
    del table["ST_B10"]["5"]
    path = stand_in(table)
    with pytest.raises(JimuError) as err:
        read_spectra(path)
    assert str(err.value) == f"{path}: column 'ST_B10' has other rows than column 'class'"
