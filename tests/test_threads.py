"""The thread plan: threads per worker and OpenMP waiting from processes, cores and load."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from deepjimu.threads import busy_elsewhere, plan_threads, scoped_env

QUIET: dict[str, str] = {}  # an environment without OpenMP settings


@pytest.mark.parametrize(
    ("processes", "cores", "busy", "threads", "wait"),
    [
        (1, 2, 0, 2, "default"),  # one worker owns the cores: OpenMP's own policy
        (2, 2, 0, 1, "default"),
        (3, 2, 0, 1, "passive"),  # more workers than cores
        (1, 2, 1, 2, "passive"),  # another program keeps a core busy
        (2, 4, 1, 2, "passive"),
        (2, 8, 3, 4, "passive"),
        (2, 8, 0, 4, "default"),
    ],
)
def test_the_rule(processes: int, cores: int, busy: int, threads: int, wait: str) -> None:
    plan = plan_threads(processes, cores=cores, environ=QUIET, busy=busy)
    assert (plan.threads, plan.wait, plan.busy) == (threads, wait, busy)
    assert plan.oversubscribed == (wait == "passive")
    assert plan.source == "threads: cores / workers, wait: rule"


def test_explicit_choices_win_over_the_environment_which_wins_over_the_rule() -> None:
    env = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "active"}
    plan = plan_threads(1, cores=2, environ=env, busy=5)
    assert (plan.threads, plan.wait) == (3, "active")
    assert plan.source == "threads: OMP_NUM_THREADS, wait: OMP_WAIT_POLICY"
    plan = plan_threads(1, threads=1, wait="passive", cores=2, environ=env, busy=0)
    assert (plan.threads, plan.wait) == (1, "passive")
    assert plan.source == "threads: --threads, wait: --omp-wait"


def test_env_and_record_name_what_the_workers_need() -> None:
    plan = plan_threads(2, cores=2, environ=QUIET, busy=1)
    assert plan.env() == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    assert plan.matches({"OMP_WAIT_POLICY": "passive"}) and not plan.matches({})
    quiet = plan_threads(1, cores=2, environ=QUIET, busy=0)
    assert quiet.env()["OMP_WAIT_POLICY"] is None and quiet.matches({})
    assert plan.record()["busy_elsewhere"] == 1 and plan.record()["omp_wait"] == "passive"
    assert "1 other busy, oversubscribed: OpenMP wait passive" in plan.describe()
    one = plan_threads(1, cores=1, environ=QUIET, busy=0).describe()
    assert one.startswith("1 worker x 1 thread on 1 core:"), one


@pytest.mark.parametrize("bad", [{"processes": 0}, {"threads": -1}, {"wait": "spin"}])
def test_bad_requests_are_refused(bad: dict[str, object]) -> None:
    args = {"processes": 1, "threads": 0, "wait": "auto", **bad}
    with pytest.raises(ValueError, match="bad thread plan request"):
        plan_threads(**args)  # type: ignore[arg-type]


@pytest.mark.slow
def test_busy_elsewhere_sees_a_spinning_process() -> None:
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin) for _ in range(2)]
    try:
        time.sleep(0.5)  # past their start-up
        assert busy_elsewhere(samples=3) >= 1  # two spinners on 2 cores: at least one runs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_scoped_env_restores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with scoped_env({"OMP_WAIT_POLICY": None, "OMP_NUM_THREADS": "1"}):
        assert "OMP_WAIT_POLICY" not in os.environ and os.environ["OMP_NUM_THREADS"] == "1"
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and "OMP_NUM_THREADS" not in os.environ
