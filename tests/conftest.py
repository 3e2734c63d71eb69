"""Shared fixtures: a small config for fast runs, and the uninterrupted runs of the fault tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from deepjimu.config import RunConfig
from processes import fault_options

# A fixed OpenMP wait policy for the whole suite: `--omp-wait auto` would otherwise choose by
# the machine's load at each run's start, and a one-worker run leaves this process (and the
# tests' monkeypatches) when the choice differs from this process's policy. PASSIVE also
# keeps the suite's many processes from spinning on CI's 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture
def small_cfg(tmp_path: Path) -> RunConfig:
    """A quick digits run writing under ``tmp_path``."""
    return RunConfig(
        strategy="local",
        model="mlp:32x2",
        epochs=2,
        quiet=True,
        runs_dir=str(tmp_path / "runs"),
        name="t",
    )


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Path]:
    """The folder of an uninterrupted run of the fault tests' config (made once per session),
    for a strategy and worker count: what a killed, resumed or restarted run must equal."""
    from deepjimu.launch import train

    root = tmp_path_factory.mktemp("uninterrupted")

    def folder(strategy: str, workers: int) -> Path:
        out = root / f"{strategy}-{workers}"
        if not out.exists():
            cfg = RunConfig(strategy=strategy, workers=workers, runs_dir=str(root), name=out.name)
            assert train(RunConfig(**{**cfg.to_dict(), **fault_options(strategy)})) is not None
        return out

    return folder
