"""The worker's parts that need no run: device choice, run folders, error records (and when none can be written)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from deepjimu import worker
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


def test_a_probe_s_folder_is_named_as_a_probe(tmp_path: Path) -> None:
    cfg = RunConfig(strategy="ddp", dataset="digits", runs_dir=str(tmp_path))
    assert re.fullmatch(r"probe-ddp-digits-\d{8}-\d{6}", default_run_name(cfg, "probe"))
    assert run_dir_of(cfg, "probe").name.startswith("probe-ddp-digits-")
    assert run_dir_of(cfg).name.startswith("ddp-digits-")


@pytest.mark.parametrize("why", ["folder removed", "disk full"])
def test_an_error_record_that_cannot_be_written_leaves_nothing_and_is_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    monkeypatch.setattr(worker, "_unreported", False)
    folder = tmp_path / "run"
    if why == "disk full":
        folder.mkdir()

        def full(path: Path, text: str) -> None:
            raise JimuError(f"cannot write {path}: no space left on the disk of {path.parent}")

        monkeypatch.setattr(worker, "atomic_write_text", full)
    worker._report(folder, 0, JimuError("checkpoint at step 2 not written"))
    assert worker._unreported, "the worker leaves with UNREPORTED_EXIT"
    if why == "folder removed":
        assert not folder.exists(), "a removed run folder stays removed"
    else:
        assert list(folder.iterdir()) == [], "no empty .errors folder"


def test_a_run_folder_removed_under_a_one_worker_run_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepjimu.launch import train
    from deepjimu.run import Run

    begin = Run.begin_fit

    def removed(run: Run) -> None:  # the user's rm -rf, just as training starts
        shutil.rmtree(run.out_dir)
        begin(run)

    monkeypatch.setattr(Run, "begin_fit", removed)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # so the worker runs in this process
    folder = tmp_path / "r"
    cfg = RunConfig(strategy="local", model="mlp:16x1", epochs=2, quiet=True, omp_wait="passive",
                    runs_dir=str(tmp_path), name="r")  # fmt: skip
    with pytest.raises(JimuError) as e:
        train(cfg)
    assert (
        str(e.value)
        == f"run folder {folder} was removed while the run was going; start the run again"
    )
    assert not folder.exists()


def test_a_worker_takes_the_data_its_launcher_saved_without_reading_the_data_set(
    tmp_path: Path,
) -> None:
    from deepjimu.data import DataOptions, load_dataset
    from deepjimu.run import Run

    data = load_dataset("synthetic", DataOptions(synthetic_n=200))
    data.save(tmp_path / "data.pt")
    cfg = RunConfig(dataset="no-such-data-set")  # read from the registry, it would fail
    run = Run(cfg, tmp_path, 0, 2, torch.device("cpu"))
    got = worker._data(cfg, str(tmp_path / "data.pt"), run)
    torch.testing.assert_close(got.train_x, data.train_x)
    assert worker._data(cfg, data, run) is data
    with pytest.raises(JimuError, match="unknown dataset 'no-such-data-set'"):
        worker._data(cfg, None, run)
