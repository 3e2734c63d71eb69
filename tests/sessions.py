"""Work a whole test session shares: made once, whichever of pytest-xdist's processes asks first."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

__all__ = ["once"]


def once(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, key: str, make: Callable[[Path], Any]
) -> Any:
    """``make(folder)``'s JSON-able result, made once per test session whichever of
    pytest-xdist's test processes asks first: the others wait on a file lock and read it
    (the pattern pytest-xdist documents for session fixtures), so four processes do not
    train the same runs four times. ``folder`` is fresh and outlives the asking process."""
    if worker_id == "master":  # no xdist: this process is the session
        return make(tmp_path_factory.mktemp(key))
    root = tmp_path_factory.getbasetemp().parent  # shared by the session's test processes
    result = root / f"{key}.json"
    with FileLock(f"{result}.lock"):
        if result.is_file():
            return json.loads(result.read_text())
        value = make(Path(tempfile.mkdtemp(prefix=f"{key}-", dir=root)))  # a failed try's aside
        result.write_text(json.dumps(value))
        return value
