"""SampleStore: each batch's per-sample pdADMM variables, on disk between its visits (``--admm-aux keep``).

pdADMM's auxiliary variables (p, z, q, u and their momentum records) hold one row per
sample, so full batch keeps O(N) of them in memory. In mini-batch mode with ``keep`` each
batch's rows are written to a file when the batch is done and read back at its next visit,
so memory holds one batch whatever N is, while the iteration goes on from where the batch
left it instead of restarting from a forward pass. Written by hand: this is a fixed-layout
row store (one file per variable, batch k always at the same rows), which needs positioned
reads and writes into preallocated tensors and nothing a database or ``numpy.memmap``
would add (a memory map's touched pages count in the process's resident memory).
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch import Tensor

from deepjimu.errors import JimuError

__all__ = ["SampleStore"]


class SampleStore:
    """Per-sample variables of fixed batches, one file per variable in a private temporary folder.

    Batch k covers rows ``bounds[k]`` to ``bounds[k + 1]`` (a contiguous range of the fixed
    sample order); a variable's file holds one row of its per-sample shape per sample. The folder is created
    under ``directory`` (default: the system's, ``TMPDIR``) and removed by :meth:`close`.

    Args:
        bounds: the first row of every batch and, last, the number of samples.
        directory: where to create the folder.
        tag: part of the folder's name (the rank, so that workers never share files).
    """

    def __init__(self, bounds: list[int], directory: str | None = None, tag: str = "") -> None:
        self.bounds = bounds
        try:
            self._dir: tempfile.TemporaryDirectory[str] | None = tempfile.TemporaryDirectory(
                prefix=f"jimu-admm{tag}-", dir=directory
            )
        except OSError as e:
            raise JimuError(f"admm cannot create its store of auxiliary variables: {e}") from None
        self._fds: dict[str, tuple[int, tuple[int, ...], torch.dtype]] = {}
        self._saved: set[int] = set()

    @property
    def path(self) -> str:
        assert self._dir is not None, "the store is closed"
        return self._dir.name

    def has(self, k: int) -> bool:
        """Whether batch k has been saved."""
        return k in self._saved

    def save(self, k: int, tensors: dict[str, Tensor]) -> None:
        """Write batch k's rows of every variable (each [rows, ...], samples first)."""
        lo, hi = self.bounds[k], self.bounds[k + 1]
        for name, t in tensors.items():
            fd, shape, dtype = self._file(name, t)
            if tuple(t.shape) != (hi - lo, *shape) or t.dtype != dtype:
                raise ValueError(f"{name}: {tuple(t.shape)} {t.dtype} is not {shape} {dtype}")
            data = t.detach().to("cpu").contiguous()
            raw = _bytes(data)
            offset = lo * data[0].numel() * data.element_size()
            try:
                while raw:
                    written = os.pwrite(fd, raw, offset)
                    raw, offset = raw[written:], offset + written
            except OSError as e:
                raise JimuError(
                    f"admm cannot write its auxiliary variables to {self.path}: {e} "
                    "(set TMPDIR to a disk with room)"
                ) from None
        self._saved.add(k)

    def load(
        self, k: int, device: torch.device, names: tuple[str, ...] | None = None
    ) -> dict[str, Tensor]:
        """Batch k's rows of every variable (or of ``names`` only), as saved last."""
        assert k in self._saved, f"batch {k} was never saved"
        lo, hi = self.bounds[k], self.bounds[k + 1]
        out = {}
        for name in self._fds if names is None else names:
            fd, shape, dtype = self._fds[name]
            buf = torch.empty((hi - lo, *shape), dtype=dtype)
            raw = _bytes(buf)
            offset = lo * buf[0].numel() * buf.element_size()
            got = os.preadv(fd, [raw], offset)
            if got != len(raw):
                raise JimuError(
                    f"admm's store of auxiliary variables is short: {name} of batch {k} read "
                    f"{got} of {len(raw)} bytes ({self.path})"
                )
            out[name] = buf.to(device)
        return out

    def _file(self, name: str, t: Tensor) -> tuple[int, tuple[int, ...], torch.dtype]:
        if name not in self._fds:
            if self._saved:  # every batch saves the same variables
                raise ValueError(f"{name} was not saved with the earlier batches")
            fd = os.open(os.path.join(self.path, name), os.O_RDWR | os.O_CREAT, 0o600)
            self._fds[name] = (fd, tuple(t.shape[1:]), t.dtype)
        return self._fds[name]

    def close(self) -> None:
        """Close and remove every file (idempotent)."""
        for fd, _, _ in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._saved.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _bytes(t: Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, shared with it (no copy)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
