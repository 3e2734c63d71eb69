"""Shared fixtures: a small config for fast runs, and the uninterrupted runs of the fault tests."""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deepjimu.config import RunConfig
from deepjimu.starting import START_METHOD
from processes import WARM, fault_options
from sessions import once

# A fixed OpenMP wait policy for the whole suite: `--omp-wait auto` would otherwise choose by
# the machine's load at each run's start, and a one-worker run leaves this process (and the
# tests' monkeypatches) when the choice differs from this process's policy. PASSIVE also
# keeps the suite's many processes from spinning on CI's 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The runs a test launches in its own process (deepjimu.launch.train) fork their workers from
# a fork server that has imported torch, its compiler and deepjimu once (3-4 s of CPU a
# worker otherwise, most of a short run's cost); the commands a test runs as a user would
# (tests/processes.env) spawn theirs, as do runs with a memory budget.
os.environ.setdefault(START_METHOD, "forkserver")
multiprocessing.set_forkserver_preload(WARM)


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's launches spawn their workers, as a user's do: the workers print on this
    test's file descriptors (``capfd``), which a fork server's children do not share."""
    monkeypatch.setenv(START_METHOD, "spawn")


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
def uninterrupted(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str
) -> Callable[[str, int], Path]:
    """The folder of an uninterrupted run of the fault tests' config (made once per session),
    for a strategy and worker count: what a killed, resumed or restarted run must equal."""
    from deepjimu.launch import train

    def make(strategy: str, workers: int, root: Path) -> str:
        cfg = RunConfig(strategy=strategy, workers=workers, runs_dir=str(root), name="run")
        assert train(RunConfig(**{**cfg.to_dict(), **fault_options(strategy)})) is not None
        return str(root / "run")

    def folder(strategy: str, workers: int) -> Path:
        key = f"uninterrupted-{strategy}-{workers}"
        return Path(
            once(tmp_path_factory, worker_id, key, lambda root: make(strategy, workers, root))
        )

    return folder


# Test files whose tests take longest on the clock (they wait on Slurm, on signals, on
# processes they start, or train several runs) are collected first, so that they start
# early rather than after the many short ones.
_LONG_FIRST = (
    "test_hpc.py",
    "test_emulate.py",  # a worker at a twentieth of a core: two minutes on a busy machine
    "test_budget.py",
    "test_readme.py",
    "strategies/test_replicas.py",
    "plan/test_command.py",
    "strategies/admm/test_strategy.py",
    "test_run.py",
    "test_launch.py",
    "api/test_fit.py",
    "bench/test_bench.py",
    "strategies/test_tp.py",
    "strategies/test_fsdp.py",
    "test_imports.py",
    "strategies/test_ddp.py",
    "strategies/admm/test_driver.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

    # the slow tests first, the longest files' first among them; the quick units last, where
    # they fill the cores while the last slow tests end
    def rank(item: pytest.Item) -> tuple[bool, int]:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        long = _LONG_FIRST.index(path) if path in _LONG_FIRST else len(_LONG_FIRST)
        return item.get_closest_marker("slow") is None, long

    items.sort(key=rank)  # stable: each file's tests keep their order


# ---- fast and slow tests --------------------------------------------------------------------
# `make test-fast` runs `pytest -m "not slow"`: the units, for the inner loop. A test that
# starts a process (workers, a CLI run, Slurm, torchrun) is slow and carries the marker; in a
# fast run a test without it that starts one anyway fails, naming the marker, so the split
# cannot rot. A file whose every test starts processes marks itself (`pytestmark`).


# Fixtures shared by a module or the session that start processes: the guard below sees
# only what a test itself starts, so the tests that use one of these are marked here.
_PROCESS_FIXTURES = {"default_runs", "ranks", "short_runs", "slurm", "uninterrupted"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: starts processes or trains whole runs (make test-fast leaves it out)"
    )


def _fast_run(config: pytest.Config) -> bool:
    return "not slow" in (config.getoption("markexpr", "") or "")


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """In a fast run, note any process an unmarked test starts, and fail it at teardown."""
    if not _fast_run(request.config) or request.node.get_closest_marker("slow"):
        yield
        return
    started: list[str] = []

    def noting(name: str, original: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            started.append(name)
            return original(*args, **kwargs)

        return wrapper

    # every way a test can start one: subprocess, multiprocessing's spawn and forkserver
    # (both exec through spawnv_passfds) and fork
    monkeypatch.setattr(
        subprocess.Popen, "_execute_child", noting("subprocess", subprocess.Popen._execute_child)
    )
    monkeypatch.setattr(
        multiprocessing.util,
        "spawnv_passfds",
        noting("multiprocessing", multiprocessing.util.spawnv_passfds),
    )
    monkeypatch.setattr(os, "fork", noting("fork", os.fork))
    yield
    if started:
        pytest.fail(
            f"{request.node.nodeid} starts a process ({started[0]}): mark it @pytest.mark.slow",
            pytrace=False,
        )
