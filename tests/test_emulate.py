"""--emulate-speeds: its parsing, the cgroup files it writes (v1 and v2), its refusals, and
(where this machine has root and a cpu controller) a real run whose slowed worker is measured
slower and gets less work."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deepjimu.config import ConfigErrors, RunConfig
from deepjimu.emulate import (
    COMM,
    ENV,
    PERIOD_US,
    CpuController,
    find_cpu_controller,
    free_comm_threads,
    parse_speeds,
    speed_groups,
    speeds_problems,
    thread_ids,
)
from deepjimu.errors import JimuError
from deepjimu.validation import validate
from processes import groups_left


@pytest.mark.parametrize(
    "text,line",
    [
        ("1,x", "--emulate-speeds takes one factor per worker, like 1,0.3 (emulate-speeds: '1,x')"),
        (
            "1,0",
            "--emulate-speeds factors must be in (0, 1], 1 being a worker's full share of its "
            "cores (emulate-speeds: 1,0; out of range: 0)",
        ),
        (
            "1.5,1",
            "--emulate-speeds factors must be in (0, 1], 1 being a worker's full share of its "
            "cores (emulate-speeds: 1.5,1; out of range: 1.5)",
        ),
    ],
)
def test_bad_factors_end_in_one_line(text: str, line: str) -> None:
    with pytest.raises(JimuError) as e:
        parse_speeds(text)
    assert str(e.value) == line


def test_one_factor_per_worker() -> None:
    assert speeds_problems("1,0.5", 2) == []
    assert speeds_problems("1,0.5", 3) == [
        "--emulate-speeds gives 2 factor(s) for 3 worker(s); give one per worker "
        "(emulate-speeds: 1,0.5)"
    ]
    with pytest.raises(ConfigErrors) as e:
        validate(RunConfig(strategy="ddp", workers=3, emulate_speeds="1,0.5"))
    assert "--emulate-speeds gives 2 factor(s) for 3 worker(s)" in str(e.value)


def test_the_cpu_controller_is_found_in_either_version(tmp_path: Path) -> None:
    v1 = "cgroup /sys/fs/cgroup/cpu cgroup rw,nosuid,cpu 0 0\n"
    assert find_cpu_controller(v1) == CpuController(Path("/sys/fs/cgroup/cpu"), 1)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    v2 = f"cgroup2 {tmp_path} cgroup2 rw,nosuid 0 0\n"
    assert find_cpu_controller(v2) == CpuController(tmp_path, 2)
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    assert find_cpu_controller(v2) is None
    assert find_cpu_controller("proc /proc proc rw 0 0\n") is None


@pytest.mark.parametrize("version", [1, 2])
def test_each_worker_gets_a_group_with_its_share_of_its_threads(
    tmp_path: Path, version: int
) -> None:
    """On a stand-in folder the files the kernel reads are written as it expects them."""
    (tmp_path / "cgroup.subtree_control").write_text("")
    with speed_groups([1.0, 0.3], threads=2, controller=CpuController(tmp_path, version)) as env:
        folder = Path(env["DEEPJIMU_SPEED_GROUPS"])
        assert folder.parent == tmp_path
        quota = round(0.3 * 2 * PERIOD_US)  # 0.3 of 2 threads' time
        if version == 1:
            assert (folder / COMM).is_dir() and not (folder / COMM / "cpu.cfs_quota_us").exists()
            assert (folder / "rank1" / "cpu.cfs_period_us").read_text() == str(PERIOD_US)
            assert (folder / "rank0" / "cpu.cfs_quota_us").read_text() == str(2 * PERIOD_US)
            assert (folder / "rank1" / "cpu.cfs_quota_us").read_text() == str(quota)
        else:
            assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
            assert (folder / "rank1" / "cpu.max").read_text() == f"{quota} {PERIOD_US}"


def _comm_group(
    folder: Path, monkeypatch: pytest.MonkeyPatch, write: Callable[[Path, str], None]
) -> None:
    """A stand-in of the launcher's groups in ``folder`` (its quota-free group), the
    worker's environment pointing at it, and ``write`` in place of the kernel's files."""
    (folder / COMM).mkdir()
    (folder / COMM / "tasks").write_text("")
    monkeypatch.setattr("deepjimu.emulate.write", write)
    monkeypatch.setenv(ENV, str(folder))


@contextlib.contextmanager
def _a_thread_started_after() -> Iterator[tuple[set[int], threading.Thread]]:
    """This process's thread ids, then one thread started after them, alive for the block."""
    before = thread_ids()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        yield before, thread
    finally:
        stop.set()
        thread.join()


def test_the_threads_a_worker_started_since_leave_its_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threads started after the snapshot (the process group's) are written to the
    quota-free group's tasks; the ones before stay."""
    written: list[str] = []
    _comm_group(tmp_path, monkeypatch, lambda path, text: written.append(text))
    with _a_thread_started_after() as (before, comm):
        free_comm_threads(before)
    assert written == [str(comm.native_id)]
    monkeypatch.delenv(ENV)  # no groups made: nothing moves
    free_comm_threads(set())
    assert written == [str(comm.native_id)]


def test_no_controller_ends_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deepjimu.emulate.find_cpu_controller", lambda: None)
    with pytest.raises(JimuError) as e, speed_groups([1.0], 1):
        pass
    assert str(e.value) == (
        "--emulate-speeds needs the kernel's cpu cgroup controller, and this machine has "
        "none mounted (no v1 cpu hierarchy, no cgroup2 with cpu)"
    )


def test_groups_that_cannot_be_made_end_in_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a group cannot be made inside a file
    with pytest.raises(JimuError) as e, speed_groups([1.0], 1, CpuController(blocked, 1)):
        pass
    assert str(e.value).startswith(f"--emulate-speeds cannot create CPU cgroups under {blocked} (")
    assert "\n" not in str(e.value)


def _real_controller() -> CpuController | None:
    found = find_cpu_controller()
    if found is None or os.geteuid() != 0:
        return None
    return found


@pytest.mark.slow
@pytest.mark.skipif(
    _real_controller() is None, reason="needs root and a mounted cpu cgroup controller"
)
def test_a_slowed_worker_is_measured_slower_and_gets_less_work(tmp_path: Path) -> None:
    controller = _real_controller()
    assert controller is not None
    before = {p.name for p in controller.root.glob("deepjimu-*")}
    run = subprocess.run(
        [
            sys.executable, "-m", "deepjimu", "train", "--strategy", "admm", "--workers", "2",
            "--emulate-speeds", "1,0.05", "--balance", "speed", "--epochs", "2",
            "--runs-dir", str(tmp_path),
            "--name", "slow",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "slow" / "summary.json").read_text())
    assert summary["emulated_speeds"] == [1.0, 0.05]
    assert summary["balance"] == "speed"
    fast, slow = summary["speeds"]
    # the quota is felt: a twentieth of a core, against what rank 0 gets beside the suite's
    # other test processes (alone 0.035 was measured; at a fifth of a core, 0.70 and then
    # 0.947 were measured beside them, as rank 0 too got little more than a fifth)
    assert fast == 1.0 and slow < 0.8, summary["speeds"]
    assert "worker speeds measured: 1.00, " in run.stdout
    assert "balance by estimated cost over speed" in run.stdout
    # the groups are gone with the run
    assert groups_left(controller.root, before) == set()


def test_a_thread_that_cannot_move_ends_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(path: Path, text: str) -> None:
        raise PermissionError(13, "Permission denied")

    _comm_group(tmp_path, monkeypatch, refuse)
    with _a_thread_started_after() as (before, _), pytest.raises(JimuError) as e:
        free_comm_threads(before)
    assert str(e.value) == (
        f"--emulate-speeds: a worker cannot move its communication threads to "
        f"{tmp_path / COMM} (Permission denied)"
    )
