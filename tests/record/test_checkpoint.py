"""Checkpoints: each rank's state back, the latest one only, one line when a rank's file is elsewhere, damaged, or finds no room."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from unittest import mock

import pytest
import torch

from deepjimu.bookkeeping import Bookkeeping
from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.counters import Counters
from deepjimu.errors import Interrupted, JimuError
from deepjimu.record.checkpoint import Checkpointer
from deepjimu.record.events import EventLog
from disks import small_disk
from distributed import distributed_test


def _checkpointer(folder: Path, rank: int, world: int) -> Checkpointer:
    counters, book = Counters(torch.device("cpu")), Bookkeeping(world)
    if rank == 0:  # as Run makes it
        folder.mkdir(parents=True, exist_ok=True)
    events = EventLog(folder, rank == 0, True, counters, book)
    return Checkpointer(RunConfig(quiet=True), folder, rank, world, counters, events, book)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


@pytest.mark.slow
@distributed_test(world_size=[1, 2, 3])
def test_each_rank_gets_its_own_state_back(rank: int, world: int, tmp: str) -> None:
    ckpt = _checkpointer(Path(tmp), rank, world)
    ckpt.counters.stats.bytes_sent = 10 + rank  # (a count in a group of one counts nothing)
    for step in (2, 4):
        if step == 4 and rank == 0:  # what a write killed at step 3 leaves
            (ckpt.dir / ".tmp-step-00000003").mkdir()
            (ckpt.dir / ".tmp-step-00000003" / "rank0.pt").write_bytes(b"cut sh")
        ckpt.save(step, step // 2, _model() if rank == 0 else None, {"rank": rank, "step": step})
    assert sorted(p.name for p in ckpt.dir.iterdir()) == ["latest", "step-00000004"]
    loaded = ckpt.load()
    assert loaded is not None and (loaded.step, loaded.epoch) == (4, 2)
    assert loaded.rank_state == {"rank": rank, "step": 4}
    assert torch.equal(loaded.model_state["weight"], _model().weight.detach())
    assert loaded.counters is not None and loaded.counters["stats"]["bytes_sent"] == 10 + rank
    meta = json.loads((ckpt.dir / "step-00000004" / "meta.json").read_text())
    assert meta["world"] == world and meta["config"]["quiet"] is True


@pytest.mark.slow
@distributed_test(world_size=[2, 3])
def test_a_rank_that_cannot_find_its_file_stops_every_rank(rank: int, world: int, tmp: str) -> None:
    ckpt = _checkpointer(Path(tmp), rank, world)
    folder = ckpt.save(1, 1, _model() if rank == 0 else None, {"rank": rank})
    Bookkeeping(world).barrier()
    if rank == 0:
        (folder / f"rank{world - 1}.pt").unlink()  # as on a machine without a shared folder
    Bookkeeping(world).barrier()
    with pytest.raises(JimuError) as e:
        ckpt.load()
    lost = folder / f"rank{world - 1}.pt"
    assert str(e.value).startswith(f"checkpoint: worker {world - 1} cannot find {lost}; ")
    assert "file system they all share" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
@distributed_test(world_size=[2, 3])
def test_a_run_folder_that_is_not_shared_is_refused(rank: int, world: int, tmp: str) -> None:
    # the last rank runs on "another machine": its run folder is a copy of its own
    elsewhere = Path(tmp) / "node-b"
    ckpt = _checkpointer(elsewhere if rank == world - 1 else Path(tmp) / "node-a", rank, world)
    lost = Path(tmp) / "node-a" / "checkpoint" / ".tmp-step-00000001" / f"rank{world - 1}.pt"
    with pytest.raises(JimuError) as e:
        ckpt.save(1, 1, _model() if rank == 0 else None, {"rank": rank})
    assert str(e.value).startswith(f"checkpoint: {lost} is missing after worker {world - 1} wrote")
    if rank == 0:  # as if node-a had finished the checkpoint alone
        (ckpt.dir / "latest").write_text("step-00000001")
    Bookkeeping(world).barrier()
    with pytest.raises(JimuError) as e:
        ckpt.load()
    latest = elsewhere / "checkpoint" / "latest"
    assert str(e.value).startswith(f"checkpoint: worker {world - 1} cannot find {latest}; every")


def test_a_checkpoint_of_another_worker_count_is_refused(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path, 0, 1)
    ckpt.save(1, 1, _model(), {})
    meta = ckpt.dir / "step-00000001" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "world": 2}))
    with pytest.raises(
        JimuError, match=r"written by 2 workers; resume with --workers 2 \(workers: 1\)"
    ):
        ckpt.load()


def test_resume_without_the_rank_state_file_is_one_line(tmp_path: Path, capsys) -> None:
    argv = ["train", "--strategy", "local", "--model", "mlp:16x1", "--epochs", "1", "--quiet"]
    assert main([*argv, "--runs-dir", str(tmp_path), "--name", "r"]) == 0
    latest = tmp_path / "r" / "checkpoint" / "latest"
    lost = latest.parent / latest.read_text() / "rank0.pt"
    lost.unlink()
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "r"), "--epochs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: checkpoint: worker 0 cannot find {lost}; ") and "\n" not in err


@pytest.mark.slow
@distributed_test(world_size=[1, 2])
def test_a_checkpoint_that_finds_no_room_keeps_the_last_one_and_leaves_nothing(
    rank: int, world: int, tmp: str
) -> None:
    ckpt = _checkpointer(Path(tmp), rank, world)
    last = ckpt.save(1, 1, _model() if rank == 0 else None, {"rank": rank})

    def full(obj: object, path: Path) -> None:
        if rank == world - 1:  # one rank's write fails: every rank stops, with its line
            raise OSError(errno.ENOSPC, "No space left on device")
        torch.save(obj, path)

    with mock.patch("deepjimu.record.checkpoint._torch_save", full), pytest.raises(JimuError) as e:
        ckpt.save(2, 2, _model() if rank == 0 else None, {"rank": rank})
    msg = str(e.value)
    assert msg.startswith(
        f"checkpoint at step 2 not written: no space left on the disk of {ckpt.dir} ("
    )
    assert msg.endswith(
        f"pick a --runs-dir on a disk with room (the last complete one, {last}, is kept)"
    )
    Bookkeeping(world).barrier()
    assert sorted(p.name for p in ckpt.dir.iterdir()) == ["latest", last.name], "no debris"
    loaded = ckpt.load()
    assert loaded is not None and loaded.step == 1 and loaded.rank_state == {"rank": rank}


@pytest.mark.slow
def test_a_first_checkpoint_on_a_full_disk_leaves_no_folder(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "64k") as disk:
        ckpt = _checkpointer(disk, 0, 1)
        # the kernel's ENOSPC, which torch's writer hides behind "unexpected pos ..."
        big = torch.nn.Linear(200, 200)  # 160 KB of weights
        with pytest.raises(JimuError) as e:
            ckpt.save(1, 1, big, {})
        assert str(e.value).startswith(
            f"checkpoint at step 1 not written: no space left on the disk of {ckpt.dir} ("
        )
        assert str(e.value).endswith("(no earlier checkpoint)")
        assert not ckpt.dir.exists()


def test_a_signal_mid_write_stops_the_run_with_its_own_line(tmp_path: Path) -> None:
    """Ctrl-C inside torch.save: torch's writer then fails closing the zip ("unexpected
    pos ..."); the signal's Interrupted must come out, not that RuntimeError (seen in CI)."""
    real_open = open
    signum = 2

    class Interrupting:  # a file whose second write is where the signal handler raises
        def __init__(self, path: Path, mode: str) -> None:
            self.f, self.writes = real_open(path, mode), 0

        def write(self, data: bytes) -> int:
            self.writes += 1
            if self.writes == 2:
                raise Interrupted(signum)
            return self.f.write(data)

        def __getattr__(self, name: str) -> object:
            return getattr(self.f, name)

        def __enter__(self) -> Interrupting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    ckpt = _checkpointer(tmp_path, 0, 1)
    with (
        mock.patch("deepjimu.record.checkpoint.open", Interrupting, create=True),
        pytest.raises(Interrupted) as e,
    ):
        ckpt.save(1, 1, torch.nn.Linear(50, 50), {})
    assert e.value.signum == signum
    assert not list(ckpt.dir.glob(".tmp-step-*")), "no half-written checkpoint left"


@pytest.mark.parametrize("name", ["model.pt", "rank0.pt"])
@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 8], ids=["empty", "random"])
def test_a_damaged_checkpoint_file_is_named_without_torchs_advice(
    tmp_path: Path, name: str, content: bytes
) -> None:
    ckpt = _checkpointer(tmp_path, 0, 1)
    damaged = ckpt.save(1, 1, _model(), {"rank": 0}) / name
    damaged.write_bytes(content)
    with pytest.raises(JimuError) as e:
        ckpt.load()
    assert str(e.value) == (
        f"checkpoint file {damaged} is damaged (torch cannot read it); restore it from a "
        "copy, or start the run again in a new folder"
    )
    # torch's own message advises weights_only=False: code execution from a tampered file
    assert "weights_only" not in str(e.value)
