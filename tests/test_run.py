"""Run: atomic writes, checkpoints, exact resume, events."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.run import Run


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    latest = (run_dir / "checkpoint" / "latest").read_text().strip()
    return torch.load(run_dir / "checkpoint" / latest / "model.pt", weights_only=True)


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
    run._train_s, run._eval_s = 0.5, 0.25  # as if timed by run.training() / run.evaluation()
    event = run.log(3, 1, samples=50, loss=1.5, test_acc=0.25)
    assert (event["bytes_sent"], event["bytes_recv"], event["loss"], event["test_acc"]) == (
        100,
        40,
        1.5,
        0.25,
    )
    assert (event["samples_per_s"], event["train_s"], event["eval_s"]) == (100.0, 0.5, 0.25)
    with run.training():
        time.sleep(0.02)
    with run.evaluation():
        time.sleep(0.01)
    event = run.log(4, 2, samples=0)
    assert event["bytes_sent"] == 0, "events hold the interval's bytes, not the running total"
    assert event["train_s"] >= 0.02 and 0.01 <= event["eval_s"] < 0.02
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
