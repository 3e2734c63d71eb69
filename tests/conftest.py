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


# Test files whose tests take longest on the clock (they wait on Slurm, on signals, on
# processes they start, or train several runs) are collected first, so that they start
# early rather than after the many short ones.
_LONG_FIRST = (
    "test_hpc.py",
    "test_readme.py",
    "plan/test_command.py",
    "strategies/admm/test_strategy.py",
    "test_run.py",
    "test_launch.py",
    "bench/test_bench.py",
    "strategies/test_ddp.py",
    "strategies/admm/test_driver.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return _LONG_FIRST.index(path) if path in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order
