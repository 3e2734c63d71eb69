"""Atomic writes: a failed write leaves the old file and no temporary file."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepjimu.atomic import atomic_write_text


def test_atomic_write_leaves_old_file_on_failure(tmp_path: Path, monkeypatch) -> None:
    p = tmp_path / "f.json"
    atomic_write_text(p, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(p, "new")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["f.json"]
