"""How the workers start: spawned, or forked from a fork server with their launcher's
environment (deepjimu.starting)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from torch import nn

from deepjimu import starting
from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.starting import START_METHOD, adopt, start_method


def test_a_worker_adopts_its_launchers_environment_and_keeps_its_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the fork server's environment when it started, then what torch's launcher gave rank 1
    server = {"KEPT": "1", "STALE": "old", "CHANGED": "server", "RANK": "1"}
    monkeypatch.setattr(starting, "_LOADED", server)
    monkeypatch.setattr(os, "environ", os.environ.copy())
    os.environ.clear()
    os.environ.update({**server, "RANK": "1", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"})
    adopt({"KEPT": "1", "CHANGED": "launcher", "NEW": "2", "RANK": "0"})
    assert dict(os.environ) == {
        "KEPT": "1", "CHANGED": "launcher", "NEW": "2",  # the launcher's, not the server's
        "RANK": "1", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x",  # the rank's own
    }  # fmt: skip


def test_the_start_method_is_spawn_or_forkserver_and_spawn_under_a_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(START_METHOD, raising=False)
    assert start_method(False) == "spawn"
    monkeypatch.setenv(START_METHOD, "forkserver")
    assert start_method(False) == "forkserver" and start_method(True) == "spawn"
    monkeypatch.setenv(START_METHOD, "fork")
    with pytest.raises(JimuError, match=r"^DEEPJIMU_START_METHOD=fork: the workers start by "):
        start_method(False)


@pytest.mark.slow
def test_a_bad_start_method_ends_the_run_before_its_folder_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(START_METHOD, "fork")
    with pytest.raises(JimuError, match=r"^DEEPJIMU_START_METHOD=fork: "):
        train(RunConfig(strategy="ddp", workers=2, quiet=True, runs_dir=str(tmp_path / "runs")))
    assert not (tmp_path / "runs").exists()


def _reporting_model() -> nn.Sequential:
    """A model factory that writes, where it runs (the launcher, each worker), the variable
    the test set."""
    Path(os.environ["JIMU_TEST_OUT"], f"rank{os.environ.get('RANK', '-launcher')}.json").write_text(
        json.dumps(os.environ.get("JIMU_TEST_VALUE"))
    )
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_workers_see_what_their_launcher_set_after_the_fork_server_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    monkeypatch.setenv(START_METHOD, method)
    cfg = RunConfig(strategy="ddp", workers=2, epochs=1, quiet=True, runs_dir="runs")
    monkeypatch.setenv("JIMU_TEST_OUT", str(tmp_path))
    for value in ("first", "second"):  # the second launch's workers fork from the same server
        monkeypatch.setenv("JIMU_TEST_VALUE", value)
        (tmp_path / value).mkdir()
        monkeypatch.chdir(tmp_path / value)  # a relative runs folder is the launcher's too
        assert train(RunConfig(**{**cfg.to_dict(), "name": value}), model_factory=_reporting_model)
        for rank in (0, 1):
            assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == value
        assert (tmp_path / value / "runs" / value / "summary.json").exists()
