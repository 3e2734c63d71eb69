"""The launcher: local workers under torch's elastic agent, torchrun, and failing workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train

FAST = {"model": "mlp:64x2", "epochs": 8, "quiet": True, "lr": 3e-3}


def test_ddp_matches_local_accuracy(tmp_path: Path) -> None:
    local = train(RunConfig(strategy="local", runs_dir=str(tmp_path), name="local", **FAST))
    ddp = train(RunConfig(strategy="ddp", workers=2, runs_dir=str(tmp_path), name="ddp", **FAST))
    assert local is not None and ddp is not None
    assert ddp["workers"] == 2
    assert abs(ddp["test_acc"] - local["test_acc"]) <= 0.01 + 1e-9, (
        ddp["test_acc"],
        local["test_acc"],
    )
    # ddp really communicates: every gradient of every step, counted in its comm hook
    events = [json.loads(x) for x in (tmp_path / "ddp" / "events.jsonl").read_text().splitlines()]
    n_params = sum(64 * i + 64 for i in (64, 64)) + 64 * 10 + 10
    per_step = 4 * n_params
    steps = events[-1]["step"]
    assert sum(e["bytes_sent_per_rank"][1] for e in events) == per_step * steps
    assert all(e["wait_s"] >= 0 for e in events)


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_torchrun_joins_the_group(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "deepjimu", "train", "--strategy", "ddp", "--model", "mlp:32x1", "--epochs", "2",
        "--quiet", "--runs-dir", str(tmp_path), "--name", "tr",
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "tr" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["strategy"] == "ddp"


def test_torchrun_refuses_a_conflicting_worker_count(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(JimuError, match="--workers 3 disagrees with torchrun's WORLD_SIZE 2"):
        train(RunConfig(strategy="ddp", workers=3, runs_dir=str(tmp_path)))


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_a_killed_worker_stops_the_run_quickly(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "deepjimu", "train", "--strategy", "ddp", "--workers", "2",
        "--model", "mlp:32x1", "--epochs", "100000", "--quiet", "--runs-dir", str(tmp_path), "--name", "k",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )
    events = tmp_path / "k" / "events.jsonl"
    deadline = time.time() + 120
    while not events.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert events.exists(), "the run never started training"
    workers = [
        p for p in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    assert len(workers) == 2, workers
    os.kill(max(workers), signal.SIGKILL)
    t0 = time.time()
    _, err = proc.communicate(timeout=60)
    assert time.time() - t0 < 30
    assert proc.returncode == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines[-1] == "error: worker 1 died (killed by SIGKILL) without reporting an error", err[
        -2000:
    ]


def test_a_worker_error_is_reported_in_one_line(tmp_path: Path) -> None:
    # a diverging ddp run: every worker raises the same JimuError at the same epoch
    cfg = RunConfig(strategy="ddp", workers=2, model="mlp:64x2", epochs=6, lr=1e6, optimizer="sgd",
                    momentum=0.0, quiet=True, runs_dir=str(tmp_path), name="nan")  # fmt: skip
    with pytest.raises(JimuError) as e:
        train(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    # the one that raised first is named
    assert re.match(r"worker [01]: training diverged at epoch \d+: loss is nan; lower --lr", msg), (
        msg
    )
    assert not (tmp_path / "nan" / ".errors").exists()
