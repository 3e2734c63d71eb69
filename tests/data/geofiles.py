"""Helpers for remote-sensing data tests: small EuroSAT-like zips, hyperspectral .mat scenes,
and a stand-in spyndex package, all written by the tests themselves."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "MS_ROOT",
    "Scene",
    "eurosat_zip",
    "fake_spyndex",
    "make_scene",
    "ms_tiff",
    "rgb_jpeg",
]

MS_ROOT = "ds/images/remote_sensing/otherDatasets/sentinel_2/tif"


def rgb_jpeg(colour: tuple[int, int, int], side: int = 64) -> bytes:
    """A JPEG of one flat colour (which JPEG keeps to within a level or two)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side), colour).save(buf, format="JPEG", quality=100)
    return buf.getvalue()


def ms_tiff(pixels: np.ndarray, planar: bool = False) -> bytes:
    """A 13-band uint16 TIFF of ``pixels [64, 64, 13]`` (bands last, as GDAL writes EuroSAT's),
    or band after band with ``planar``."""
    import tifffile

    buf = io.BytesIO()
    data = pixels.transpose(2, 0, 1) if planar else pixels
    tifffile.imwrite(buf, data, planarconfig="separate" if planar else "contig")
    return buf.getvalue()


def eurosat_zip(members: dict[str, bytes]) -> bytes:
    """A zip holding ``name -> bytes`` members (and the folders above them, as the official
    archives list them)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        folders = sorted({str(Path(n).parent) + "/" for n in members})
        for folder in folders:
            z.writestr(folder, b"")
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


@dataclass
class Scene:
    """A generated hyperspectral scene: the cube ``[rows, cols, bands]`` and ground truth."""

    cube: np.ndarray
    gt: np.ndarray

    def write(self, folder: Path, names: tuple[str, str, str, str]) -> Path:
        """Write ``(cube file, cube key, gt file, gt key)`` as MATLAB v5 files; the folder."""
        import scipy.io

        cube_file, cube_key, gt_file, gt_key = names
        folder.mkdir(parents=True, exist_ok=True)
        scipy.io.savemat(folder / cube_file, {cube_key: self.cube})
        scipy.io.savemat(folder / gt_file, {gt_key: self.gt})
        return folder

    def mat_bytes(self, key: str, which: str) -> bytes:
        """One file's bytes (``which``: cube or gt), as the server of a download sends them."""
        import scipy.io

        buf = io.BytesIO()
        scipy.io.savemat(buf, {key: self.cube if which == "cube" else self.gt})
        return buf.getvalue()


def make_scene(
    counts: dict[int, int],
    shape: tuple[int, int, int] = (12, 10, 6),
    seed: int = 0,
) -> Scene:
    """A uint16 cube of ``shape`` whose class-c pixels (``counts[c]`` of them, at random
    places; the rest 0 = no label) have spectra around ``1000 * c`` per band."""
    rng = np.random.default_rng(seed)
    h, w, b = shape
    gt = np.zeros(h * w, np.uint8)
    spots = rng.permutation(h * w)
    start = 0
    for c, n in counts.items():
        gt[spots[start : start + n]] = c
        start += n
    gt = gt.reshape(h, w)
    base = 1000 * gt[:, :, None].astype(np.int64) + 100 * np.arange(b)
    cube = (base + rng.integers(0, 50, (h, w, b))).astype(np.uint16)
    return Scene(cube, gt)


def fake_spyndex(root: Path, table: object) -> Path:
    """A package ``spyndex`` under ``root`` whose ``data/spectral.json`` is ``table`` (a
    str: the file's text as is); returns ``root``, to put on ``sys.path``."""
    data = root / "spyndex" / "data"
    data.mkdir(parents=True)
    (root / "spyndex" / "__init__.py").write_text("raise ImportError('not to be imported')\n")
    text = table if isinstance(table, str) else json.dumps(table)
    (data / "spectral.json").write_text(text)
    return root
