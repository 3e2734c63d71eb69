"""Atomic writes: a failed write leaves the old file and no temporary file; a full disk is one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from deepjimu.atomic import append_whole, atomic_write_text
from deepjimu.errors import JimuError
from disks import small_disk


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


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_written_files_get_the_mode_the_umask_gives(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "config.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == mode


def test_a_write_that_finds_no_room_is_one_line_naming_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "summary.json"
    atomic_write_text(p, "old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(JimuError) as e:
        atomic_write_text(p, "new")
    msg = str(e.value)
    assert msg.startswith(f"cannot write {p}: no space left on the disk of {tmp_path} (")
    assert msg.endswith("free space there or write to a folder on another disk")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.slow
def test_an_append_that_finds_no_room_is_cut_back_off(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "16k") as disk:
        log = disk / "events.jsonl"
        append_whole(log, '{"step": 1}\n')
        with pytest.raises(JimuError, match=f"no space left on the disk of {disk} "):
            append_whole(log, "x" * 40_000 + "\n")  # more than the disk: written in part
        assert log.read_text() == '{"step": 1}\n', "no half line"
        with pytest.raises(JimuError, match="no space left"):
            append_whole(disk / "new.jsonl", "x" * 40_000 + "\n")
        assert sorted(p.name for p in disk.iterdir()) == ["events.jsonl"], "no file it began"
