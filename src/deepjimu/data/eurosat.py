"""``eurosat``, ``eurosat-ms``: Sentinel-2 patches of 64 x 64 pixels in 10 land-cover classes.

Read straight from the official zip archives, one folder per class (Helber et al., 2019):
``EuroSAT.zip`` holds RGB JPEGs, ``EuroSATallBands.zip`` 13-band GeoTIFFs. JPEGs are decoded
with Pillow (installed with matplotlib); GeoTIFFs with ``tifffile`` (the ``geo`` extra),
a small, maintained, numpy-only reader: Pillow does not read 13-band 16-bit images, and
rasterio would bring GDAL for files that need no geo-referencing here.

Not torchvision's ``EuroSAT``, although torchvision 0.28.0 matches torch 2.13.0: it covers
RGB only, so the 13 bands need this reader anyway, and its download writes in place
(no atomic write, no mirror) and fails with a traceback.
"""

from __future__ import annotations

import functools
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType

import numpy as np

from deepjimu.choices import Family
from deepjimu.data.base import DataOptions, RawData, per_class_split, register_dataset
from deepjimu.data.download import local_or_fetched
from deepjimu.errors import JimuError, one_line

__all__ = ["CLASSES", "SIDE", "VARIANTS", "Variant", "load_eurosat", "read_archive"]

# the class folders, in the order of their numbers (alphabetical, as torchvision numbers them)
CLASSES = (
    "AnnualCrop",
    "Forest",
    "HerbaceousVegetation",
    "Highway",
    "Industrial",
    "Pasture",
    "PermanentCrop",
    "Residential",
    "River",
    "SeaLake",
)
SIDE = 64
TRAIN_FRACTION = 0.8  # no official split: 80% of each class trains, as digits' 80 / 20


@dataclass(frozen=True)
class Variant:
    """One EuroSAT archive: its name, the folder holding the class folders, the image kind."""

    archive: str
    root: str  # the folder of the class folders inside the archive
    suffix: str
    bands: int
    scale: float  # pixel value -> float: 8-bit RGB / 255, Sentinel-2 L1C digital numbers / 10,000


VARIANTS = {
    "eurosat": Variant("EuroSAT.zip", "2750", ".jpg", 3, 255.0),
    "eurosat-ms": Variant(
        "EuroSATallBands.zip",
        "ds/images/remote_sensing/otherDatasets/sentinel_2/tif",
        ".tif",
        13,
        10000.0,
    ),
}


def read_archive(path: Path, variant: Variant) -> tuple[np.ndarray, np.ndarray]:
    """Every image of a EuroSAT archive: ``[N, bands, 64, 64]`` as stored (uint8 or uint16)
    and int64 class numbers (the index of the folder's name in :data:`CLASSES`).

    Members outside ``variant.root`` and folders are ignored; every ``variant.suffix`` file
    under it must sit in a class folder and decode to a 64 x 64 image of ``variant.bands``.

    Raises:
        JimuError: unreadable or damaged archive, no images, an unknown class folder, or an
            image that does not decode or has another size, naming the member.

    Example:
        >>> x, y = read_archive(Path("data/eurosat/EuroSAT.zip"), VARIANTS["eurosat"])
        >>> x.shape
        (27000, 3, 64, 64)
    """
    decode = _decoder(variant)
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if _under(m, variant)]
            if not members:
                raise JimuError(f"{path}: holds no {variant.suffix} images under {variant.root}/")
            x = np.empty((len(members), variant.bands, SIDE, SIDE), _dtype(variant))
            y = np.empty(len(members), np.int64)
            for i, m in enumerate(members):
                folder = PurePosixPath(m.filename).parent.name
                if folder not in CLASSES:
                    raise JimuError(
                        f"{path}: {m.filename} is in no class folder "
                        f"(the folders are {', '.join(CLASSES)})"
                    )
                x[i] = _image(path, m.filename, archive.read(m), decode, variant)
                y[i] = CLASSES.index(folder)
    except JimuError:
        raise
    except OSError as e:
        raise JimuError(f"{path}: cannot be read ({one_line(e)})") from None
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as e:
        raise JimuError(
            f"{path}: damaged zip archive ({type(e).__name__}: {one_line(e)})"
        ) from None
    return x, y


def _under(m: zipfile.ZipInfo, variant: Variant) -> bool:
    name = m.filename
    return (
        not m.is_dir()
        and name.startswith(variant.root + "/")
        and name.lower().endswith(variant.suffix)
    )


def _dtype(variant: Variant) -> type[np.generic]:
    return np.uint8 if variant.bands == 3 else np.uint16


def _decoder(variant: Variant) -> ModuleType:
    if variant.suffix == ".jpg":
        from PIL import Image

        return Image
    try:
        import tifffile
    except ImportError:
        raise JimuError(
            "eurosat-ms needs the tifffile package: pip install 'deepjimu[geo]'"
        ) from None
    return tifffile


def _image(
    path: Path, member: str, data: bytes, decode: ModuleType, variant: Variant
) -> np.ndarray:
    """One member's pixels as ``[bands, 64, 64]``."""
    try:
        if variant.suffix == ".jpg":
            with decode.open(io.BytesIO(data)) as im:
                arr = np.asarray(im.convert("RGB")).transpose(2, 0, 1)
        else:
            arr = decode.imread(io.BytesIO(data))
            if arr.ndim == 3 and arr.shape[2] == variant.bands:  # bands last (pixel-interleaved)
                arr = arr.transpose(2, 0, 1)
    except Exception as e:  # a damaged image fails inside the decoder in many ways
        raise JimuError(
            f"{path}: {member} is not a readable image ({type(e).__name__}: {one_line(e)})"
        ) from None
    if arr.shape != (variant.bands, SIDE, SIDE):
        raise JimuError(
            f"{path}: {member} has shape {arr.shape}; EuroSAT images are "
            f"{variant.bands} x {SIDE} x {SIDE}"
        )
    return arr


def load_eurosat(name: str, opts: DataOptions) -> RawData:
    """27,000 images ``[N, bands, 64, 64]`` as float32, split per class into train and test.

    RGB pixels are divided by 255 (in [0, 1]); the 13 bands of ``eurosat-ms`` are the
    Sentinel-2 L1C digital numbers divided by 10,000 (top-of-atmosphere reflectance, which
    can exceed 1). Each class gives ``opts.train_fraction`` of its images (default 0.8) to
    training, drawn with ``opts.seed``. The archive ``opts.data_dir / name / <archive>`` is
    read as it is (fetched first, MD5 verified, with ``opts.download``); nothing is
    extracted. Memory: float32 copies of the images, about 1.3 GB for RGB and 5.7 GB for
    13 bands, more while loading.

    Raises:
        JimuError: a missing archive (with a hint to ``--download``), or a bad one.
    """
    variant = VARIANTS[name]
    path = local_or_fetched(
        name, Path(opts.data_dir) / name / variant.archive, opts.download, opts.data_url
    )
    raw, y = read_archive(path, variant)
    fraction = TRAIN_FRACTION if opts.train_fraction is None else opts.train_fraction
    train, test = per_class_split(y, fraction, opts.seed)

    def floats(rows: np.ndarray) -> np.ndarray:
        return raw[rows].astype(np.float32) / np.float32(variant.scale)

    return RawData(floats(train), y[train], floats(test), y[test], num_classes=len(CLASSES))


for _name in VARIANTS:
    register_dataset(_name, Family.IMAGES)(functools.partial(load_eurosat, _name))
