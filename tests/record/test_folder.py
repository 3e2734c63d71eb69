"""The run folder: its OS lock, new runs only in a free folder, resumes only as the checkpoint says."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deepjimu.cli import main
from deepjimu.config import CONFIG_VERSION, ConfigErrors, RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.record.folder import check_resume, latest_checkpoint, lock_run_dir, saved_config
from deepjimu.record.read import read_events


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.mark.slow
def test_the_lock_admits_one_holder_and_dies_with_it(tmp_path: Path) -> None:
    run = tmp_path / "r"
    with lock_run_dir(run):
        with pytest.raises(JimuError) as e, lock_run_dir(run):
            pass
        assert str(e.value) == (
            f"run folder {run} is in use by another run (pid {os.getpid()}); "
            "wait for it to end or pick another --name"
        )
    with lock_run_dir(run):  # released at the end of the block
        pass
    # another process holds it until it is killed: the OS releases a flock however it ends
    code = "import sys, time; from deepjimu.record.folder import lock_run_dir\n"
    code += "with lock_run_dir(__import__('pathlib').Path(sys.argv[1])):\n"
    code += "    print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True, env=_env()
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        held = rf"in use by another run \(pid {holder.pid}\)"
        with pytest.raises(JimuError, match=held), lock_run_dir(run):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock_run_dir(run):
        pass


def _checkpointed(tmp_path: Path, **kw: object) -> Path:
    """A folder as a run leaves it: config.json and a checkpoint at epoch 60 (written by hand)."""
    run = tmp_path / "x"
    cfg = {**RunConfig(strategy="ddp", workers=2, model="mlp:64x2", epochs=60).to_dict(), **kw}
    ckpt = run / "checkpoint" / "step-00000060"
    ckpt.mkdir(parents=True)
    meta = {"step": 60, "epoch": 60, "world": 2, "config": cfg}
    (ckpt / "meta.json").write_text(json.dumps(meta))
    (run / "checkpoint" / "latest").write_text(ckpt.name)
    (run / "config.json").write_text(json.dumps(cfg))
    return run


def test_a_resume_keeps_what_the_checkpoint_says(tmp_path: Path) -> None:
    run = _checkpointed(tmp_path)
    ok = RunConfig(strategy="ddp", workers=2, model="mlp:64x2", epochs=80, resume=str(run))
    check_resume(ok)
    bad = RunConfig(
        strategy="local", workers=1, model="mlp:128x2", dataset="mnist", epochs=10, resume=str(run)
    )
    with pytest.raises(ConfigErrors) as e:
        check_resume(bad)
    ckpt = run / "checkpoint" / "step-00000060"
    assert e.value.problems == [
        f"--resume {run}: --strategy local contradicts the checkpoint's ddp ({ckpt})",
        f"--resume {run}: --workers 1 contradicts the checkpoint's 2 ({ckpt})",
        f"--resume {run}: --dataset mnist contradicts the checkpoint's digits ({ckpt})",
        f"--resume {run}: --model mlp:128x2 contradicts the checkpoint's mlp:64x2 ({ckpt})",
        f"--resume {run}: --epochs 10 is below the checkpoint's epoch 60 ({ckpt}); "
        "give --epochs 60 or more",
    ]
    (ckpt / "meta.json").write_text("{")
    with pytest.raises(JimuError, match=r"checkpoint .*step-00000060 is damaged"):
        latest_checkpoint(run)


@pytest.mark.parametrize(
    ("saved", "expected"),
    [
        ({"admm_bits": 8}, "holds option(s) this deepjimu does not know (admm_bits)"),
        ({"config_version": 99}, "was written by a newer deepjimu (config_version 99; this one "
                                 f"reads {CONFIG_VERSION} and older)"),
    ],
)  # fmt: skip
def test_a_saved_config_of_another_version_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], saved: dict, expected: str
) -> None:
    run = _checkpointed(tmp_path, **saved)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["train", "--resume", str(run), "--epochs", "61"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --resume {run}: {run / 'config.json'} {expected}; resume it with the " \
        "deepjimu that wrote it, or start a new run\n"  # fmt: skip
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_run_saves_its_config_with_the_layout_version(tmp_path: Path) -> None:
    cfg = RunConfig(strategy="local", model="mlp:8x1", epochs=1, quiet=True, threads=1,
                    runs_dir=str(tmp_path), name="v")  # fmt: skip
    train(cfg)
    saved = json.loads((tmp_path / "v" / "config.json").read_text())
    assert saved["config_version"] == CONFIG_VERSION
    assert set(saved_config(tmp_path / "v")) == set(cfg.to_dict())  # the options alone


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-epoch local run (mlp:32x1), made once; tests resume copies of it."""
    root = tmp_path_factory.mktemp("resume")
    argv = ["train", "--strategy", "local", "--model", "mlp:32x1", "--epochs", "2", "--quiet"]
    assert main([*argv, "--threads", "1", "--runs-dir", str(root), "--name", "x"]) == 0
    return root / "x"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--model", "mlp:128x2"], "--model mlp:128x2 contradicts the checkpoint's mlp:32x1"),
        (["--dataset", "synthetic"], "--dataset synthetic contradicts the checkpoint's digits"),
        (["--strategy", "ddp"], "--strategy ddp contradicts the checkpoint's local"),
        (["--epochs", "1"], "--epochs 1 is below the checkpoint's epoch 2"),
    ],
)
def test_a_contradicting_resume_is_one_line_and_leaves_the_folder_alone(
    two_epochs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    expected: str,
) -> None:
    run = tmp_path / "x"
    shutil.copytree(two_epochs, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["train", "--resume", str(run), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --resume {run}: {expected}"), err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    # the folder is intact: a plain resume goes on from it
    assert main(["train", "--resume", str(run), "--epochs", "3"]) == 0
    assert json.loads((run / "summary.json").read_text())["epochs"] == 3
    assert [e["epoch"] for e in read_events(run)] == [1, 2, 3]


def test_a_second_run_with_one_name_ends_in_one_line(tmp_path: Path) -> None:
    cfg = RunConfig(strategy="local", model="mlp:8x1", epochs=1, quiet=True, threads=1,
                    runs_dir=str(tmp_path), name="same")  # fmt: skip
    # concurrent: the first run holds the folder
    with lock_run_dir(tmp_path / "same"), pytest.raises(JimuError, match="in use by another run"):
        train(cfg)
    assert not (tmp_path / "same" / "config.json").exists()
    train(cfg)
    t0 = time.time()
    with pytest.raises(JimuError, match="already holds a run; pick another --name or --resume"):
        train(cfg)  # later
    assert time.time() - t0 < 5, "refused before any worker started"
