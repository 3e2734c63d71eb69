"""SampleStore: each batch's per-sample pdADMM variables, on disk between its visits (``--admm-aux keep``).

pdADMM's auxiliary variables (p, z, q, u and their momentum records) hold one row per
sample, so full batch keeps O(N) of them in memory. In mini-batch mode with ``keep`` each
batch's rows are written to a file when the batch is done and read back at its next visit,
so memory holds one batch whatever N is, while the iteration goes on from where the batch
left it instead of restarting from a forward pass. Written by hand: this is a fixed-layout
row store (one file per variable, batch k always at the same rows), which needs positioned
reads and writes into preallocated tensors and nothing a database or ``numpy.memmap``
would add (a memory map's touched pages count in the process's resident memory).

The files have no name (``tempfile.TemporaryFile``: O_TMPFILE on Linux, else unlinked at
once), so the system frees them when the process ends, however it ends: a worker killed
by SIGKILL or the out-of-memory killer leaves nothing in ``TMPDIR``, where named files of
a large run would stay for good.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from typing import BinaryIO

import torch
from torch import Tensor

from deepjimu.errors import JimuError
from deepjimu.memory import available_memory
from deepjimu.units import format_bytes

__all__ = ["SampleStore", "mount_type", "room"]

# the share of a folder's free space that stores may fill, and where the folder is in memory
# (tmpfs, ramfs: /tmp on many Linux systems) the share of the available memory as well
DISK_SHARE = 0.8
MEMORY_SHARE = 0.1
_IN_MEMORY = ("tmpfs", "ramfs")


def mount_type(path: str, mounts: str) -> str | None:
    """The file system type of ``path`` in ``mounts`` (the text of ``/proc/mounts``): the
    entry whose mount point is the longest prefix of the resolved path; None if none is.

    By hand: the standard library has no call for it, and psutil's ``disk_partitions``
    would be a new dependency for these few lines.
    """
    real = os.path.realpath(path)
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def room(directory: str) -> tuple[int, str]:
    """The bytes stores may fill under ``directory``, and what bounds them (for messages).

    :data:`DISK_SHARE` of its free space; where the folder is in memory, at most
    :data:`MEMORY_SHARE` of the available memory too: a store that holds O(N) variables
    so that the process's memory stays flat in N must not move them into memory instead.
    """
    free = shutil.disk_usage(directory).free
    limit, how = int(DISK_SHARE * free), f"{format_bytes(free)} free"
    try:
        with open("/proc/mounts") as f:
            kind = mount_type(directory, f.read())
    except OSError:  # not Linux: judged by its free space alone
        return limit, how
    available = available_memory()
    if kind not in _IN_MEMORY or available is None:
        return limit, how
    limit = min(limit, int(MEMORY_SHARE * available))
    return limit, f"{how}, a {kind}: memory, {format_bytes(available)} available"


class SampleStore:
    """Per-sample variables of fixed batches, one unnamed temporary file per variable.

    Batch k covers rows ``bounds[k]`` to ``bounds[k + 1]`` (a contiguous range of the fixed
    sample order); a variable's file holds one row of its per-sample shape per sample. The
    files are created under ``directory`` (default: the system's, ``TMPDIR``) and are gone
    once :meth:`close` closes them, or the process ends.

    Args:
        bounds: the first row of every batch and, last, the number of samples.
        directory: where to create the files.
        tag: part of the files' names while they are created (the rank).
    """

    def __init__(self, bounds: list[int], directory: str | None = None, tag: str = "") -> None:
        self.bounds = bounds
        self.directory = directory or tempfile.gettempdir()
        self._prefix = f"jimu-admm{tag}-"
        self._files: dict[str, tuple[BinaryIO, tuple[int, ...], torch.dtype]] = {}
        self._saved: set[int] = set()

    def nbytes(self) -> int:
        """The bytes the store's files hold now."""
        return sum(os.fstat(f.fileno()).st_size for f, _, _ in self._files.values())

    def has(self, k: int) -> bool:
        """Whether batch k has been saved."""
        return k in self._saved

    def save(self, k: int, tensors: dict[str, Tensor]) -> None:
        """Write batch k's rows of every variable (each [rows, ...], samples first)."""
        lo, hi = self.bounds[k], self.bounds[k + 1]
        for name, t in tensors.items():
            f, shape, dtype = self._file(name, t)
            if tuple(t.shape) != (hi - lo, *shape) or t.dtype != dtype:
                raise ValueError(f"{name}: {tuple(t.shape)} {t.dtype} is not {shape} {dtype}")
            data = t.detach().to("cpu").contiguous()
            raw = _bytes(data)
            offset, _ = self._span(k, shape, dtype)
            try:
                while raw:
                    written = os.pwrite(f.fileno(), raw, offset)
                    raw, offset = raw[written:], offset + written
            except OSError as e:
                raise JimuError(
                    f"admm cannot write its auxiliary variables under {self.directory}: {e} "
                    "(set TMPDIR to a disk with room)"
                ) from None
        self._saved.add(k)

    def will_need(self, k: int) -> None:
        """Tell the system that batch k's rows are read next, so that it can read them from
        disk in the background while this batch computes (a hint; no-op where unsupported
        or when k was never saved)."""
        if k not in self._saved or not hasattr(os, "posix_fadvise"):
            return
        for f, shape, dtype in self._files.values():
            os.posix_fadvise(f.fileno(), *self._span(k, shape, dtype), os.POSIX_FADV_WILLNEED)

    def load(
        self, k: int, device: torch.device, names: tuple[str, ...] | None = None
    ) -> dict[str, Tensor]:
        """Batch k's rows of every variable (or of ``names`` only), as saved last."""
        assert k in self._saved, f"batch {k} was never saved"
        lo, hi = self.bounds[k], self.bounds[k + 1]
        out = {}
        for name in self._files if names is None else names:
            f, shape, dtype = self._files[name]
            buf = torch.empty((hi - lo, *shape), dtype=dtype)
            raw = _bytes(buf)
            offset, _ = self._span(k, shape, dtype)
            got = os.preadv(f.fileno(), [raw], offset)
            if got != len(raw):
                raise JimuError(
                    f"admm's store of auxiliary variables is short: {name} of batch {k} read "
                    f"{got} of {len(raw)} bytes (under {self.directory})"
                )
            out[name] = buf.to(device)
        return out

    def _span(self, k: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, int]:
        """Where batch k's rows of a variable of per-sample ``shape`` lie in its file:
        (offset, length) in bytes."""
        row = math.prod(shape) * dtype.itemsize
        return self.bounds[k] * row, (self.bounds[k + 1] - self.bounds[k]) * row

    def _file(self, name: str, t: Tensor) -> tuple[BinaryIO, tuple[int, ...], torch.dtype]:
        if name not in self._files:
            if self._saved:  # every batch saves the same variables
                raise ValueError(f"{name} was not saved with the earlier batches")
            try:  # kept open until close(), so no context manager
                f = tempfile.TemporaryFile(dir=self.directory, prefix=self._prefix, buffering=0)  # noqa: SIM115
            except OSError as e:
                raise JimuError(
                    f"admm cannot create its store of auxiliary variables under "
                    f"{self.directory}: {e}"
                ) from None
            self._files[name] = (f, tuple(t.shape[1:]), t.dtype)
        return self._files[name]

    def close(self) -> None:
        """Close every file, which frees it (idempotent)."""
        for f, _, _ in self._files.values():
            f.close()
        self._files.clear()
        self._saved.clear()


def _bytes(t: Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, shared with it (no copy)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
