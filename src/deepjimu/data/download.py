"""Fetch official dataset files over HTTP: MD5 verified, written atomically, one-line errors."""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from deepjimu.atomic import atomic_path
from deepjimu.errors import JimuError, one_line

__all__ = [
    "SOURCES",
    "Source",
    "extract_tar",
    "fetch",
    "file_md5",
    "local_or_fetched",
    "source_url",
]

TIMEOUT_S = 30.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Source:
    """Where a dataset's files live and the MD5 of each official file (name -> hex digest).

    ``paths``: the path under ``base_url`` of a file that the server keeps elsewhere than
    under its name (the EHU site files each scene in a folder of its own); a mirror serves
    every file under its name.
    """

    base_url: str
    md5: dict[str, str] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)


PLANETOID_URL = "https://github.com/kimiyoung/planetoid/raw/master/data/"
EHU_URL = "https://www.ehu.eus/ccwintco/uploads/"

# The checksums are torchvision's (torchvision/datasets/mnist.py and cifar.py); Cora's are
# those of the official files recorded with the copy in ../shared/data/planetoid. No
# published checksums of the Citeseer and PubMed files were found to check against, so
# none is invented: their downloads are checked by format instead (see ``fetch``); the
# same holds for the hyperspectral scenes below.
SOURCES: dict[str, Source] = {
    "mnist": Source(
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        {
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
    ),
    "fashion-mnist": Source(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        {
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
    ),
    "kmnist": Source(
        "http://codh.rois.ac.jp/kmnist/dataset/kmnist/",
        {
            "train-images-idx3-ubyte.gz": "bdb82020997e1d708af4cf47b453dcf7",
            "train-labels-idx1-ubyte.gz": "e144d726b3acfaa3e44228e80efcd344",
            "t10k-images-idx3-ubyte.gz": "5c965bf0a639b31b8f53240b1b52f4d7",
            "t10k-labels-idx1-ubyte.gz": "7320c461ea6c1c855c0b718fb2a4b134",
        },
    ),
    "cifar10": Source(
        "https://www.cs.toronto.edu/~kriz/",
        {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"},
    ),
    "cora": Source(
        PLANETOID_URL,
        {
            "ind.cora.allx": "c9083193a57057dd1238321e140194d7",
            "ind.cora.ally": "125d70817fe1fdbfdcad991995e81579",
            "ind.cora.graph": "b37c419cec179f45834467630c278e4c",
            "ind.cora.test.index": "9b822cae1d01f41e8bf8782e20367c0e",
            "ind.cora.tx": "b29c36916768e1d2f55391c1aa9317ac",
            "ind.cora.ty": "48bf43f54fa5b86089a4bd0299795f10",
            "ind.cora.x": "190831eee19d8f330d89d94b40a65c5a",
            "ind.cora.y": "78344284e3ff7fd24eb9c307d51351eb",
        },
    ),
    "citeseer": Source(PLANETOID_URL),
    "pubmed": Source(PLANETOID_URL),
    # Karpathy's char-rnn repository; the MD5 of the copy in ../shared/data/shakespeare
    # (its README gives the SHA-256 too)
    "shakespeare-char": Source(
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/",
        {"input.txt": "6fb458f1232090904fb40fe944165e91"},
    ),
    # EuroSAT: the archives torchvision (datasets/eurosat.py: RGB) and TorchGeo
    # (datasets/eurosat.py: all bands) download, at a pinned revision, with their MD5s
    "eurosat": Source(
        "https://huggingface.co/datasets/torchgeo/eurosat/resolve/"
        "c877bcd43f099cd0196738f714544e355477f3fd/",
        {"EuroSAT.zip": "c8fa014336c82ac7804f0398fcb19387"},
    ),
    "eurosat-ms": Source(
        "https://hf.co/datasets/torchgeo/eurosat/resolve/1ce6f1bfb56db63fd91b6ecc466ea67f2509774c/",
        {"EuroSATallBands.zip": "5ac12b3b2557aa56e1826e981e8e200e"},
    ),
    # the hyperspectral scenes of the Grupo de Inteligencia Computacional (UPV/EHU), which
    # publishes no checksums: each file is checked by format instead (key, official shape)
    "indian-pines": Source(
        EHU_URL,
        paths={
            "Indian_pines_corrected.mat": "6/67/Indian_pines_corrected.mat",
            "Indian_pines_gt.mat": "c/c4/Indian_pines_gt.mat",
        },
    ),
    "pavia-u": Source(
        EHU_URL,
        paths={"PaviaU.mat": "e/ee/PaviaU.mat", "PaviaU_gt.mat": "5/50/PaviaU_gt.mat"},
    ),
}


def source_url(dataset: str, file_name: str, mirror: str | None = None) -> str:
    """URL of ``file_name`` of ``dataset``: ``<mirror or official base>/<file_name>``.

    Example:
        >>> source_url("mnist", "t10k-labels-idx1-ubyte.gz", "http://127.0.0.1:8000/m")
        'http://127.0.0.1:8000/m/t10k-labels-idx1-ubyte.gz'
    """
    if mirror:
        return mirror.rstrip("/") + "/" + file_name
    source = SOURCES[dataset]
    return source.base_url.rstrip("/") + "/" + source.paths.get(file_name, file_name)


def file_md5(path: Path) -> str:
    """Hex MD5 of the file at ``path``, read in chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def local_or_fetched(
    dataset: str,
    path: Path,
    download: bool,
    mirror: str | None = None,
    check: Callable[[Path, Path], None] | None = None,
) -> Path:
    """``path`` where it is a file; else, with ``download``, the official file of that
    name fetched there (:func:`fetch`, with ``mirror`` and ``check``).

    Raises:
        JimuError: the file is missing and ``download`` is off (one line saying how to
            fetch it), or the download failed (see :func:`fetch`).
    """
    if path.is_file():
        return path
    if not download:
        raise JimuError(f"{dataset}: missing file {path}; run with --download to fetch it")
    return fetch(dataset, path.name, path, mirror, check=check)


def fetch(
    dataset: str,
    file_name: str,
    dest: Path,
    mirror: str | None = None,
    check: Callable[[Path, Path], None] | None = None,
) -> Path:
    """Download one official file of ``dataset`` to ``dest``, verify its MD5, then move it in place.

    The bytes go to a temporary file next to ``dest`` that is renamed only once the transfer
    is complete and the checksum matches, so ``dest`` is either absent or whole: a failed,
    interrupted or corrupt transfer leaves neither ``dest`` nor a temporary file behind.
    A file with no known checksum is fetched only when ``check`` is given: it must accept
    the downloaded file's format before the file is moved in place.

    Args:
        dataset: a key of :data:`SOURCES`, whose table holds the expected MD5.
        file_name: the file's name on the server (and in the table).
        dest: where the verified file goes; its folder is created.
        mirror: base URL that replaces the official one (``--data-url``).
        check: ``check(downloaded, dest)`` raises JimuError (naming ``dest``) when the
            downloaded file is not a valid ``file_name``; used only without a checksum.

    Returns:
        ``dest``.

    Raises:
        JimuError: network or HTTP error, short transfer, checksum mismatch or a format
            that ``check`` refuses (one line).

    Example:
        >>> fetch("mnist", "t10k-labels-idx1-ubyte.gz", Path("data/mnist/t10k-labels-idx1-ubyte.gz"))
    """
    expected = SOURCES[dataset].md5.get(file_name)
    if expected is None and check is None:
        raise JimuError(f"{dataset}: no checksum is known for {file_name}; refusing to download it")
    url = source_url(dataset, file_name, mirror)
    how = "" if expected else " (no published checksum: its format is checked instead)"
    print(f"downloading {url} -> {dest}{how}", file=sys.stderr)
    try:
        with atomic_path(dest, suffix=".part") as tmp:
            with open(tmp, "wb") as out:
                got = _transfer(url, out)
            if expected is None:
                assert check is not None
                check(tmp, dest)
            elif (actual := file_md5(tmp)) != expected:
                raise JimuError(
                    f"{dest}: checksum mismatch after download from {url} "
                    f"(md5 {actual}, expected {expected}; {got} bytes)"
                )
    except OSError as e:  # the folder cannot be created or written (network errors are JimuError)
        raise JimuError(f"{dest.parent}: cannot write the download there ({one_line(e)})") from None
    return dest


def _transfer(url: str, out: BinaryIO) -> int:
    """Copy the body of ``url`` into the open binary file ``out``; the number of bytes."""
    got = 0
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            length = resp.headers.get("Content-Length")
            for block in iter(lambda: resp.read(_CHUNK), b""):
                out.write(block)
                got += len(block)
    except urllib.error.HTTPError as e:
        raise JimuError(f"download of {url} failed: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise JimuError(f"download of {url} failed: {one_line(e.reason)}") from None
    except (OSError, http.client.HTTPException) as e:
        raise JimuError(
            f"download of {url} was interrupted after {got} bytes "
            f"({type(e).__name__}: {one_line(e)}); run again"
        ) from None
    # http.client returns b"" when the server closes early instead of raising
    if length is not None and length.isdigit() and got != int(length):
        raise JimuError(
            f"download of {url} was interrupted (got {got} of {int(length)} bytes); run again"
        )
    return got


def extract_tar(archive: Path, dest: Path, top: str) -> Path:
    """Extract folder ``top`` of a .tar.gz into ``dest``, refusing any unsafe member.

    Only regular files and folders under ``top/`` are accepted: absolute paths, ``..``,
    links and devices are errors. The archive is unpacked into a temporary folder next to
    ``dest / top`` and renamed into place, so a failure leaves no half-extracted folder.

    Returns:
        ``dest / top``.

    Raises:
        JimuError: unreadable archive or unsafe / unexpected member (one line).
    """
    target = dest / top
    tmp = Path(tempfile.mkdtemp(prefix=f".{top}.", suffix=".part", dir=dest))
    try:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = tar.getmembers()
                for m in members:
                    _check_member(archive, m, top)
                for m in members:
                    _extract_member(tar, m, tmp)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise JimuError(
                f"{archive}: cannot be extracted ({type(e).__name__}: {one_line(e)})"
            ) from None
        if not (tmp / top).is_dir():
            raise JimuError(f"{archive}: has no folder {top}/")
        try:
            os.replace(tmp / top, target)
        except OSError:
            if not target.is_dir():  # another process won the race: its copy is as good
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _check_member(archive: Path, m: tarfile.TarInfo, top: str) -> None:
    parts = Path(m.name).parts
    unsafe = (
        m.name.startswith(("/", "\\"))
        or ".." in parts
        or not parts
        or parts[0] != top
        or not (m.isfile() or m.isdir())
    )
    if unsafe:
        raise JimuError(f"{archive}: refusing unsafe or unexpected member {m.name!r}")


def _extract_member(tar: tarfile.TarFile, m: tarfile.TarInfo, root: Path) -> None:
    path = root.joinpath(*Path(m.name).parts)
    if m.isdir():
        path.mkdir(parents=True, exist_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    src = tar.extractfile(m)
    assert src is not None  # regular files always have a stream
    with src, open(path, "wb") as out:
        for block in iter(lambda: src.read(_CHUNK), b""):
            out.write(block)
