"""Atomic file writes: readers see the old file or the whole new one, never a half-written one.

No torch import here: the data layer, the bench and the CLI use these without loading
torch.distributed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]


@contextlib.contextmanager
def atomic_path(path: Path, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside ``path``; moved onto ``path`` if the block ends without error.

    Readers see the old file or the whole new one, and a failed or interrupted write leaves
    no temporary file behind.

    Example:
        >>> with atomic_path(Path("runs/r/model.pt")) as tmp:  # doctest: +SKIP
        ...     torch.save(state, tmp)
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Text version of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode())
