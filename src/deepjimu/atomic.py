"""Atomic file writes: readers see the old file or the whole new one, never a half-written one.

No torch import here: the data layer, the bench and the CLI use these without loading
torch.distributed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from deepjimu.errors import JimuError
from deepjimu.units import format_bytes

__all__ = [
    "append_whole",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "no_space",
    "space_error",
]

# the errors of a write that found no room: the disk is full, or the user's quota is
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space(e: BaseException) -> bool:
    """True if ``e`` is a write that found no room (ENOSPC: disk full, EDQUOT: quota)."""
    return isinstance(e, OSError) and e.errno in _NO_SPACE


def space_error(
    folder: Path, e: OSError, what: str, todo: str = "write to a folder on another disk"
) -> JimuError:
    """The one line for a write under ``folder`` that found no room (see :func:`no_space`):
    ``what`` failed, why, the folder's free space now, and what to do (``todo``, after
    "free space there or").

    Example:
        >>> space_error(Path("runs/r"), OSError(errno.ENOSPC, "full"), "cannot write events.jsonl")
        JimuError('cannot write events.jsonl: no space left on the disk of runs/r (0 B free); free space there or write to a folder on another disk')
    """
    why = "disk quota exceeded" if e.errno == errno.EDQUOT else "no space left on the disk"
    try:
        free = f" ({format_bytes(shutil.disk_usage(folder).free)} free)"
    except OSError:
        free = ""
    return JimuError(f"{what}: {why} of {folder}{free}; free space there or {todo}")


@contextlib.contextmanager
def atomic_path(path: Path, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside ``path``; moved onto ``path`` if the block ends without error.

    Readers see the old file or the whole new one, and a failed or interrupted write leaves
    no temporary file behind. The file gets the mode any new file of this process gets
    (0666 less the umask: 0644 with the usual 022).

    Raises:
        JimuError: the disk (or the quota) has no room for the file (:func:`space_error`).

    Example:
        >>> with atomic_path(Path("runs/r/model.pt")) as tmp:  # doctest: +SKIP
        ...     torch.save(state, tmp)
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _new_file(path.parent, f".{path.name}.", suffix)
    except OSError as e:
        if no_space(e):
            raise space_error(path.parent, e, f"cannot write {path}") from None
        raise
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        if no_space(e):
            raise space_error(path.parent, e, f"cannot write {path}") from None
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _new_file(folder: Path, prefix: str, suffix: str) -> Path:
    """Create a new, empty file with a random name in ``folder``.

    By hand, not ``tempfile.mkstemp``: that creates the file with mode 0600 whatever the
    umask, and our files (config.json, summary.json, checkpoints) are the user's results,
    to be read as any file they write. ``os.open`` with 0666 lets the kernel apply the
    umask, with no window in which the process's umask is changed (``os.umask`` would be).
    """
    while True:
        tmp = folder / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    Raises:
        JimuError: no room for it (:func:`atomic_path`).
    """
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Text version of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode())


def append_whole(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` whole or not at all: a write cut short (a full disk) is
    cut back off (the file removed if this write began it), so that readers never see
    half a line.

    Raises:
        JimuError: the disk (or the quota) has no room for it (:func:`space_error`).
    """
    # unbuffered: each write reaches the file here, where its failure can be undone
    with open(path, "ab", buffering=0) as f:
        end = f.seek(0, os.SEEK_END)
        try:
            rest = memoryview(text.encode())
            while rest:
                rest = rest[f.write(rest) :]
        except OSError as e:
            f.truncate(end)
            if end == 0:  # a file this write began: none is left
                path.unlink()
            if no_space(e):
                raise space_error(path.parent, e, f"cannot write {path}") from None
            raise
