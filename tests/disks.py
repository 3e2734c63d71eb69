"""Test helper: a really full disk, a tmpfs of a few KB mounted for the test (root only)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["small_disk"]


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``"64k"``) mounted at ``path`` for the block, unmounted after.

    Skips the test, saying why, where this process may not mount one (not root, or a
    container without the capability): a simulated ENOSPC cannot show what the kernel does
    with a write cut short.
    """
    if os.geteuid() != 0:
        pytest.skip("a small tmpfs (a full disk for real) needs root to mount")
    path.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
