"""``indian-pines``, ``pavia-u``: pixel-wise classification of hyperspectral scenes.

Each scene is two MATLAB files, as the Grupo de Inteligencia Computacional (UPV/EHU)
publishes them: a cube ``[rows, cols, bands]`` of one spectrum per pixel and a ground truth
``[rows, cols]`` of class numbers, 0 meaning "no label". The labelled pixels become the
samples: each its spectrum (bands as features, for MLPs), or with ``patch`` K the K x K
window around it (``[bands, K, K]``, for CNNs). Read with ``scipy.io.loadmat``.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
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
from deepjimu.data.download import local_or_fetched
from deepjimu.errors import JimuError, one_line

__all__ = [
    "SCENES",
    "PixelScene",
    "Scene",
    "load_hyperspectral",
    "pixel_scene",
    "read_mat",
    "read_scene",
    "scene_split",
    "windows",
]


@dataclass(frozen=True)
class Scene:
    """One hyperspectral scene: its files, the variable each holds, its official size."""

    cube_file: str
    cube_key: str
    gt_file: str
    gt_key: str
    shape: tuple[int, int, int]  # rows, cols, bands of the official cube
    num_classes: int
    train_fraction: float  # the default share of each class's pixels that trains


SCENES = {
    # 145 x 145 pixels of AVIRIS, 200 bands (the water-absorption bands removed), 16 classes
    "indian-pines": Scene(
        "Indian_pines_corrected.mat",
        "indian_pines_corrected",
        "Indian_pines_gt.mat",
        "indian_pines_gt",
        (145, 145, 200),
        16,
        0.1,
    ),
    # 610 x 340 pixels of ROSIS over the University of Pavia, 103 bands, 9 classes
    "pavia-u": Scene("PaviaU.mat", "paviaU", "PaviaU_gt.mat", "paviaU_gt", (610, 340, 103), 9, 0.1),
}


def read_mat(path: Path, key: str, ndim: int, shown: Path | None = None) -> np.ndarray:
    """The numeric array ``key`` of the MATLAB file ``path``, of ``ndim`` dimensions.

    Raises:
        JimuError: unreadable or damaged file (a MATLAB v7.3 file too: the official ones
            are v5), no variable ``key``, or not a finite real array of ``ndim``
            dimensions; naming ``shown`` (default ``path``).

    Example:
        >>> read_mat(Path("data/indian-pines/Indian_pines_gt.mat"), "indian_pines_gt", 2).shape
        (145, 145)
    """
    import scipy.io  # here, not at import: start-up stays light

    shown = shown or path
    try:
        data = path.read_bytes()
    except OSError as e:
        raise JimuError(f"{shown}: cannot be read ({one_line(e)})") from None
    try:
        contents = scipy.io.loadmat(io.BytesIO(data), variable_names=[key])
        if key not in contents:
            names = sorted(name for name, _, _ in scipy.io.whosmat(io.BytesIO(data)))
            raise JimuError(
                f"{shown}: has no variable {key!r} (variables: {', '.join(names) or 'none'})"
            )
    except JimuError:
        raise
    except Exception as e:  # a damaged file fails inside scipy in many ways
        raise JimuError(
            f"{shown}: not a readable MATLAB file ({type(e).__name__}: {one_line(e)})"
        ) from None
    arr = contents[key]
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf" or arr.ndim != ndim:
        what = (
            f"{arr.dtype} array of shape {arr.shape}"
            if isinstance(arr, np.ndarray)
            else type(arr).__name__
        )
        raise JimuError(f"{shown}: {key!r} must be a {ndim}-D numeric array (got {what})")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise JimuError(f"{shown}: {key!r} holds values that are not finite numbers")
    return arr


def read_scene(name: str, opts: DataOptions) -> tuple[np.ndarray, np.ndarray]:
    """The cube ``[rows, cols, bands]`` and the ground truth ``[rows, cols]`` (int64, 0 =
    no label) of scene ``name`` from ``opts.data_dir / name`` (fetched with ``opts.download``).

    Files in place are read at any size (a crop of the scene, a generated one) as long as
    cube and ground truth agree; a download must have the official size.

    Raises:
        JimuError: a missing file (with a hint to ``--download``), a bad file, a ground truth
            of another size than the cube, or a class number out of range.
    """
    scene = SCENES[name]
    folder = Path(opts.data_dir) / name
    cube_path = _locate(name, folder, scene.cube_file, scene.cube_key, 3, scene.shape, opts)
    gt_path = _locate(name, folder, scene.gt_file, scene.gt_key, 2, scene.shape[:2], opts)
    cube = read_mat(cube_path, scene.cube_key, 3)
    gt = read_mat(gt_path, scene.gt_key, 2)
    if gt.shape != cube.shape[:2]:
        raise JimuError(
            f"{gt_path}: ground truth of {gt.shape[0]}x{gt.shape[1]} pixels, but the cube "
            f"{cube_path.name} has {cube.shape[0]}x{cube.shape[1]}"
        )
    if gt.dtype.kind == "f" and (gt != np.round(gt)).any():
        raise JimuError(f"{gt_path}: class numbers must be whole numbers")
    labels = gt.astype(np.int64)
    bad = (labels < 0) | (labels > scene.num_classes)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise JimuError(
            f"{gt_path}: class {labels[r, c]} at pixel ({r}, {c}) out of range "
            f"0..{scene.num_classes} (0: no label)"
        )
    return cube, labels


def scene_split(gt: np.ndarray, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat pixel indices (into ``rows * cols``) of the labelled pixels drawn for training
    and of the rest for testing: :func:`~deepjimu.data.base.per_class_split` of each class.
    """
    labelled = np.flatnonzero(gt.ravel() > 0)
    train, test = per_class_split(gt.ravel()[labelled], train_fraction, seed)
    return labelled[train], labelled[test]


def windows(cube: np.ndarray, pixels: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` x ``k`` window of ``cube [rows, cols, bands]`` centred on each flat pixel
    index, as ``[n, bands, k, k]``; outside the scene the windows read zeros (the band
    mean, once the cube is standardised).

    Example:
        >>> windows(np.ones((4, 4, 2), np.float32), np.array([0]), 3)[0, 0]
        array([[0., 0., 0.],
               [0., 1., 1.],
               [0., 1., 1.]], dtype=float32)
    """
    w = cube.shape[1]
    r = k // 2
    padded = np.pad(cube, ((r, r), (r, r), (0, 0)))
    rows, cols = np.divmod(pixels, w)
    out = np.empty((len(pixels), cube.shape[2], k, k), np.float32)
    for i in range(k):
        for j in range(k):
            out[:, :, i, j] = padded[rows + i, cols + j]
    return out


@dataclass(frozen=True)
class PixelScene:
    """A scene ready for training: the cube standardised with the training pixels'
    statistics, its ground truth, and the flat pixel indices (into ``rows * cols``) of
    the training and test pixels."""

    cube: np.ndarray  # float32 [rows, cols, bands]
    gt: np.ndarray  # int64 [rows, cols]: 0 no label, else the class number 1..C
    train: np.ndarray
    test: np.ndarray

    def samples(self, pixels: np.ndarray, patch: int = 0) -> np.ndarray:
        """The samples of these flat pixel indices: spectra ``[n, bands]`` (``patch`` 0) or
        windows ``[n, bands, patch, patch]`` (:func:`windows`)."""
        if patch:
            return windows(self.cube, pixels, patch)
        return self.cube.reshape(-1, self.cube.shape[2])[pixels]

    def labels(self, pixels: np.ndarray) -> np.ndarray:
        """Class indices 0..C-1 of these (labelled) flat pixel indices."""
        return self.gt.ravel()[pixels] - 1


def pixel_scene(name: str, opts: DataOptions) -> PixelScene:
    """Scene ``name`` read (:func:`read_scene`), split per class (:func:`scene_split`, with
    ``opts.train_fraction``, default the scene's 10%, and ``opts.seed``) and standardised:
    each band to mean 0, std 1 over the training pixels (the test pixels never enter them).

    Example:
        >>> s = pixel_scene("indian-pines", DataOptions(data_dir=Path("data")))
        >>> s.samples(s.train).shape[1], s.samples(s.train, patch=5).shape[1:]
        (200, (200, 5, 5))

    Raises:
        JimuError: as :func:`read_scene`, or a ground truth without labels.
    """
    scene = SCENES[name]
    cube, gt = read_scene(name, opts)
    fraction = scene.train_fraction if opts.train_fraction is None else opts.train_fraction
    train, test = scene_split(gt, fraction, opts.seed)
    if not len(train):
        raise JimuError(f"{name}: the ground truth labels no pixel")
    h, w, bands = cube.shape
    cube = standardize(cube.reshape(h * w, bands), train).reshape(h, w, bands)
    return PixelScene(cube, gt, train, test)


def load_hyperspectral(name: str, opts: DataOptions) -> RawData:
    """The labelled pixels of scene ``name`` (:func:`pixel_scene`) as train and test samples.

    Classes are renumbered 0..C-1 (the file's 1..C). ``opts.patch`` 0: each sample is the
    pixel's spectrum ``[bands]``; K (odd): the K x K window around it, ``[bands, K, K]``.

    Raises:
        JimuError: as :func:`pixel_scene`, or an even ``patch``.
    """
    if opts.patch < 0 or (opts.patch and opts.patch % 2 == 0):
        raise JimuError(f"patch must be 0 or an odd window size (patch: {opts.patch})")
    s = pixel_scene(name, opts)
    h, w, bands = s.cube.shape
    info = {"scene": f"{h}x{w}x{bands}", "labelled_pixels": len(s.train) + len(s.test)}
    return RawData(
        s.samples(s.train, opts.patch),
        s.labels(s.train),
        s.samples(s.test, opts.patch),
        s.labels(s.test),
        SCENES[name].num_classes,
        info=info,
    )


def _locate(
    name: str,
    folder: Path,
    file_name: str,
    key: str,
    ndim: int,
    shape: tuple[int, ...],
    opts: DataOptions,
) -> Path:
    def check(downloaded: Path, dest: Path) -> None:  # no published checksum: the format
        arr = read_mat(downloaded, key, ndim, shown=dest)
        if arr.shape != shape:
            got, want = "x".join(map(str, arr.shape)), "x".join(map(str, shape))
            raise JimuError(f"{dest}: downloaded {key!r} is {got}, the official file's is {want}")

    return local_or_fetched(name, folder / file_name, opts.download, opts.data_url, check=check)


for _name in SCENES:
    register_dataset(_name, Family.TABULAR)(functools.partial(load_hyperspectral, _name))
