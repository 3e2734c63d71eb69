"""The worker's parts that need no run: device choice, run folders, error records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.worker import (
    default_run_name,
    error_dir,
    pick_device,
    run_dir_of,
    worker_main,
)


def test_pick_device_takes_the_cpu_without_a_gpu_per_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device(RunConfig(device="auto"), 0, 2) == torch.device("cpu")
    assert pick_device(RunConfig(device="cpu"), 1, 2) == torch.device("cpu")
    with pytest.raises(
        JimuError, match=r"one GPU per worker \(GPUs: 0, workers on this machine: 2\)"
    ):
        pick_device(RunConfig(device="cuda"), 0, 2)


def test_run_folders_are_the_resumed_one_or_named_under_runs_dir(tmp_path: Path) -> None:
    assert run_dir_of(RunConfig(runs_dir=str(tmp_path), name="x")) == tmp_path / "x"
    assert run_dir_of(RunConfig(name="x", resume=str(tmp_path / "old"))) == tmp_path / "old"
    assert re.fullmatch(
        r"ddp-mnist-\d{8}-\d{6}", default_run_name(RunConfig(strategy="ddp", dataset="mnist"))
    )
    assert run_dir_of(RunConfig(runs_dir=str(tmp_path))).parent == tmp_path


@pytest.mark.parametrize("report", [True, False])
def test_a_failing_worker_leaves_its_error_for_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report: bool
) -> None:
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process is the test's
    for name in ("RANK", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    cfg = RunConfig(strategy="nope", threads=1, omp_wait="passive").to_dict()
    with pytest.raises(JimuError, match="unknown strategy 'nope'"):
        worker_main(cfg, str(tmp_path), report_errors=report)
    records = list(error_dir(tmp_path).glob("rank*.json"))
    if not report:
        assert records == []
        return
    (record,) = [json.loads(p.read_text()) for p in records]
    assert (record["rank"], record["attempt"], record["user_error"]) == (0, 0, True)
    assert (
        record["message"].startswith("unknown strategy 'nope'")
        and "Traceback" in record["traceback"]
    )
