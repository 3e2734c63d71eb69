"""Run: atomic writes, checkpoints, exact resume, events."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from deepjimu.cli import main
from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.record.folder import latest_checkpoint
from deepjimu.record.read import read_events
from deepjimu.run import Run
from processes import (
    descendants,
    events,
    fault_flags,
    fault_options,
    params,
    start,
    wait_for_epochs,
)


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return params(run_dir)


@pytest.mark.parametrize("optimizer", ["adam", "sgd", "kfac"])
def test_resumed_local_run_equals_uninterrupted(tmp_path: Path, optimizer: str) -> None:
    common = {
        "strategy": "local",
        "model": "mlp:32x2",
        "quiet": True,
        "runs_dir": str(tmp_path),
        "optimizer": optimizer,
    }
    train(RunConfig(epochs=4, name="full", **common))
    train(RunConfig(epochs=2, name="part", **common))
    halfway = _params(tmp_path / "part")
    train(RunConfig(epochs=4, resume=str(tmp_path / "part"), **common))
    full, resumed = _params(tmp_path / "full"), _params(tmp_path / "part")
    assert full.keys() == resumed.keys()
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
    assert not torch.equal(halfway["0.1.weight"], resumed["0.1.weight"]), (
        "the resumed run did not train"
    )
    events = [json.loads(x) for x in (tmp_path / "part" / "events.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in events] == [1, 2, 3, 4]


def test_checkpoint_every_keeps_only_the_latest_complete_one(tmp_path: Path) -> None:
    cfg = RunConfig(strategy="local", model="mlp:16x1", epochs=3, checkpoint_every=1, quiet=True,
                    runs_dir=str(tmp_path), name="c")  # fmt: skip
    train(cfg)
    root = tmp_path / "c" / "checkpoint"
    assert sorted(p.name for p in root.iterdir()) == ["latest", (root / "latest").read_text()]
    folder = root / (root / "latest").read_text()
    assert json.loads((folder / "meta.json").read_text())["epoch"] == 3
    assert not list(root.glob(".tmp-*"))


def test_damaged_checkpoint_is_one_line(tmp_path: Path) -> None:
    cfg = RunConfig(
        strategy="local", model="mlp:16x1", epochs=1, quiet=True, runs_dir=str(tmp_path), name="d"
    )
    train(cfg)
    root = tmp_path / "d" / "checkpoint"
    folder = root / (root / "latest").read_text()
    (folder / "model.pt").write_bytes(b"not a checkpoint")
    run = Run(cfg, tmp_path / "d")
    with pytest.raises(JimuError, match=r"checkpoint .* is damaged"):
        run.load_checkpoint()


def test_diverging_run_stops_with_a_clear_message(tmp_path: Path) -> None:
    cfg = RunConfig(strategy="local", model="mlp:64x2", epochs=6, lr=1e6, optimizer="sgd", momentum=0.0,
                    checkpoint_every=1, quiet=True, runs_dir=str(tmp_path), name="nan")  # fmt: skip
    with pytest.raises(JimuError, match=r"training diverged at epoch \d+: loss is nan; lower --lr"):
        train(cfg)
    assert not (tmp_path / "nan" / "summary.json").exists()


def test_log_merges_metrics_and_counts_bytes(tmp_path: Path) -> None:
    run = Run(RunConfig(quiet=True), tmp_path)
    run.comm.count(sent=100, recv=40)
    # as if timed by run.training() and run.evaluation()
    run.counters.train_s, run.counters.eval_s = 0.5, 0.25
    event = run.log(3, 1, samples=50, loss=1.5, test_acc=0.25)
    assert (event["bytes_sent"], event["bytes_recv"], event["loss"], event["test_acc"]) == (
        100,
        40,
        1.5,
        0.25,
    )
    assert (event["samples_per_s"], event["train_s"], event["eval_s"]) == (100.0, 0.5, 0.25)
    assert event["samples"] == 50
    with run.training():
        time.sleep(0.02)
    with run.evaluation():
        time.sleep(0.01)
    event = run.log(4, 2, samples=10)
    assert event["bytes_sent"] == 0, "events hold the interval's bytes, not the running total"
    # the clocks are readings since the run began; throughput is the interval's
    assert event["train_s"] >= 0.52 and 0.26 <= event["eval_s"] < 0.5
    assert event["samples"] == 60 and event["samples_per_s"] <= 10 / 0.02
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == 2


def test_log_splits_the_bytes_sent_by_kind_per_interval(tmp_path: Path) -> None:
    run = Run(RunConfig(quiet=True), tmp_path)
    run.comm.count(sent=100)
    run.comm.count(sent=30, kind="kfac_factors")
    event = run.log(1, 1)
    assert event["bytes_sent"] == 130 and event["bytes_sent_by_kind"] == {"kfac_factors": 30}
    run.comm.count(sent=5, kind="kfac_factors")
    run.comm.count(sent=7, kind="kfac_gradients")
    assert run.log(2, 2)["bytes_sent_by_kind"] == {"kfac_factors": 5, "kfac_gradients": 7}


def test_a_resumed_run_goes_on_with_one_history(tmp_path: Path) -> None:
    cfg = RunConfig(quiet=True)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    run = Run(cfg, tmp_path)
    for step in (1, 2):
        run.comm.count(sent=100, recv=100)
        run.counters.train_s += 0.5
        run.log(step, step, samples=10)
    run.comm.count(sent=7, recv=7)  # traffic after the last event, before the checkpoint
    run.begin_fit()
    run.save_checkpoint(2, 2, model, {})
    run.log(3, 3, samples=10)  # work that a crash loses: it will be done again
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"step": 4, "ep')  # and the line the crash cut short

    again = Run(cfg, tmp_path)
    ckpt = again.load_checkpoint()
    assert ckpt is not None and ckpt.step == 2
    again.continue_history(ckpt, "--resume")
    kept = read_events(tmp_path)
    assert [e["step"] for e in kept] == [1, 2]
    assert again.elapsed() >= ckpt.time_s >= kept[-1]["time_s"]
    assert again.fit_s() >= ckpt.fit_s > 0
    again.comm.count(sent=1, recv=1)
    event = again.log(3, 3, samples=10)
    # the bytes since the last kept event: those before the checkpoint and those after
    assert event["bytes_sent"] == 8 and event["time_s"] >= ckpt.time_s
    assert (event["train_s"], event["samples"]) == (1.0, 30), "the clocks go on too"
    assert event["resumed"] == {"step": 2, "epoch": 2, "by": "--resume", "events_dropped": 1}
    assert again.stats.bytes_sent == 208, "the counters go on from the checkpoint's"
    assert again.save_checkpoint(2, 2, model, {}) == again.checkpoints.dir / "step-00000002"
    again.continue_history(None, "restart 1")  # no checkpoint: the history starts over
    assert read_events(tmp_path) == []


_SAME = ("step", "epoch", "loss", "train_acc", "val_acc", "test_acc", "bytes_sent", "bytes_recv")


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "workers"), [("local", 1), ("ddp", 2), ("admm", 2)])
def test_kill_9_then_resume_equals_the_uninterrupted_run(
    tmp_path: Path, uninterrupted: Callable[[str, int], Path], strategy: str, workers: int
) -> None:
    run = tmp_path / "k"
    argv = ["train", "--strategy", strategy, "--workers", str(workers), *fault_flags(strategy)]
    proc = start([*argv, "--runs-dir", str(tmp_path), "--name", "k"])
    try:
        wait_for_epochs(run, 2, proc)
        spawned = [p for p in descendants(proc.pid) if b"spawn_main" in _cmdline(p)]
        assert len(spawned) == (workers if workers > 1 else len(spawned)), spawned
        os.kill(max(spawned or [proc.pid]), signal.SIGKILL)  # a worker: rank 1, or the only one
        t0 = time.time()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert len(events(run)) < fault_options(strategy)["epochs"], (
        "the run ended before it was killed"
    )
    found = latest_checkpoint(run)
    assert found is not None
    if workers > 1:  # the launcher stops the others quickly, names the dead one and the way on
        assert time.time() - t0 < 30 and proc.returncode == 2
        last = [x for x in err.splitlines() if x.strip()][-1]
        assert last == (
            "error: worker 1 died (killed by SIGKILL) without reporting an error; "
            f"last checkpoint: {found[0]} (go on with: jimu train --resume {run})"
        ), err
    before = found[1]

    assert main(["train", "--resume", str(run)]) == 0
    ref, got = events(uninterrupted(strategy, workers)), events(run)
    # one history: each step once, clocks that never go back, the resume recorded
    assert [[e[k] for k in _SAME] for e in got] == [[e[k] for k in _SAME] for e in ref]
    times = [e["time_s"] for e in got]
    assert times == sorted(times) and times[-1] > before["time_s"]
    (resumed,) = [e["resumed"] for e in got if "resumed" in e]
    assert resumed["step"] == before["step"] and resumed["by"] == "--resume"
    # the summary covers the whole run
    summary = json.loads((run / "summary.json").read_text())
    ref_summary = json.loads((uninterrupted(strategy, workers) / "summary.json").read_text())
    assert (summary["epochs"], summary["steps"]) == (ref_summary["epochs"], ref_summary["steps"])
    assert summary["bytes_sent"] == ref_summary["bytes_sent"] == sum(e["bytes_sent"] for e in got)
    clocks = ("time_s", "fit_s", "train_s", "eval_s", "samples")
    assert [summary[k] for k in clocks] == [got[-1][k] for k in clocks], "the last event's"
    assert summary["time_s"] > before["time_s"] and summary["samples"] == ref_summary["samples"]
    for e in [*got, summary]:  # one clock: its parts never exceed it
        assert e["train_s"] + e["eval_s"] <= e["fit_s"] <= e["time_s"], e
    # and the same weights as a run that was never interrupted
    full, resumed_params = params(uninterrupted(strategy, workers)), params(run)
    assert full.keys() == resumed_params.keys()
    for k in full:
        assert torch.equal(full[k], resumed_params[k]), k


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
