"""``landsat-spectra``: 120 labelled Landsat 8 pixels that ship with the ``spyndex`` package.

``spyndex/data/spectral.json`` (MIT) holds, per sample, the surface reflectance of the 7
OLI bands ``SR_B1`` .. ``SR_B7`` and the surface temperature ``ST_B10`` (kelvin), labelled
Vegetation (46), Urban (37) or Water (37): column -> {row number: value}, as pandas writes
a table. Small and linearly separable: real data for a smoke test, not a benchmark.

The file is found through the package's import spec and read as JSON, without importing
spyndex (which would import its own dependencies for nothing).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np

from deepjimu.choices import Family
from deepjimu.data.base import (
    DataOptions,
    RawData,
    per_class_split,
    register_dataset,
    standardize,
)
from deepjimu.errors import JimuError, one_line

__all__ = ["BANDS", "CLASSES", "load_landsat_spectra", "read_spectra", "spectra_file"]

BANDS = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7", "ST_B10")
CLASSES = ("Urban", "Vegetation", "Water")  # numbered alphabetically
TRAIN_FRACTION = 0.5  # half of each class trains: a test set of 61 samples, not a handful
INSTALL = "landsat-spectra needs the spyndex package: pip install 'deepjimu[geo]'"


def spectra_file() -> Path:
    """Where the installed spyndex keeps ``spectral.json``.

    Raises:
        JimuError: spyndex is not installed (one line saying how to install it).
    """
    spec = importlib.util.find_spec("spyndex")
    if spec is None or not spec.submodule_search_locations:
        raise JimuError(INSTALL)
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "spectral.json"


def read_spectra(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The samples of ``spectral.json``: float64 ``[N, 8]`` in :data:`BANDS` order, and int64
    class numbers (indices into :data:`CLASSES`), in the file's row order.

    Raises:
        JimuError: unreadable or not JSON, a missing column, rows that differ between
            columns, a value that is not a finite number, or an unknown class.
    """
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise JimuError(f"{path}: cannot be read ({one_line(e)})") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise JimuError(f"{path}: not a JSON file ({one_line(e)})") from None
    if not isinstance(table, dict):
        raise JimuError(f"{path}: expected a table (column -> rows), got {type(table).__name__}")
    columns = {}
    for name in (*BANDS, "class"):
        col = table.get(name)
        if not isinstance(col, dict) or not col:
            raise JimuError(f"{path}: no column {name!r} of rows (columns: {', '.join(table)})")
        columns[name] = col
    bad = [r for r in columns["class"] if not r.isdigit()]
    if bad:
        raise JimuError(f"{path}: row {bad[0]!r} is not a row number")
    rows = sorted(columns["class"], key=int)
    for name, col in columns.items():
        if col.keys() != columns["class"].keys():
            raise JimuError(f"{path}: column {name!r} has other rows than column 'class'")
    x = np.empty((len(rows), len(BANDS)))
    for j, band in enumerate(BANDS):
        for i, r in enumerate(rows):
            v = columns[band][r]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise JimuError(f"{path}: {band} of row {r} is not a finite number ({v!r})")
            x[i, j] = v
    y = np.empty(len(rows), np.int64)
    for i, r in enumerate(rows):
        label = columns["class"][r]
        if label not in CLASSES:
            raise JimuError(
                f"{path}: class {label!r} of row {r} is not one of {', '.join(CLASSES)}"
            )
        y[i] = CLASSES.index(label)
    return x, y


@register_dataset("landsat-spectra", Family.TABULAR)
def load_landsat_spectra(opts: DataOptions) -> RawData:
    """120 samples of 8 features, 3 classes, split per class with ``opts.seed``.

    Each class gives ``opts.train_fraction`` of its samples (default 0.5) to training;
    every feature is standardised with the training samples' mean and std (the thermal band
    is in kelvin, ~290, the reflectances below 0.4).

    Raises:
        JimuError: spyndex is missing (how to install it), or its file is not as expected.
    """
    x, y = read_spectra(spectra_file())
    fraction = TRAIN_FRACTION if opts.train_fraction is None else opts.train_fraction
    train, test = per_class_split(y, fraction, opts.seed)
    x = standardize(x, train)
    return RawData(x[train], y[train], x[test], y[test], num_classes=len(CLASSES))
