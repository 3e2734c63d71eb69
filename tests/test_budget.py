"""``--memory-limit``: sizes, the kernel's memory groups (made, read, removed) and, where this
machine has root and a memory controller, a real run that passes its budget and is named."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deepjimu.budget import (
    group_limit,
    limit_problems,
    memory_groups,
    oom_kills,
)
from deepjimu.cgroups import Controller, find_controller, own_group
from deepjimu.errors import JimuError
from deepjimu.units import parse_size
from processes import groups_left


def test_sizes_read_as_people_write_them() -> None:
    assert parse_size("1.5G") == 3 * 2**29
    assert parse_size("512M") == parse_size("512mb") == parse_size("512MiB") == 2**29
    assert parse_size("4096") == 4096 and parse_size("1T") == 2**40
    for bad in ("", "G", "lots", "-1G", "0", "inf"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_a_bad_budget_is_one_line() -> None:
    assert limit_problems("") == [] and limit_problems("1.5G") == []
    assert limit_problems("lots") == [
        "--memory-limit takes a size like 1.5G, 512M or 2GB (memory-limit: lots)"
    ]
    assert limit_problems("10M")[0].startswith("--memory-limit must be at least 64M")


def test_the_controller_and_this_process_group_are_read_from_the_kernels_files(
    tmp_path: Path,
) -> None:
    v1 = "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    assert find_controller("memory", v1) == Controller(Path("/sys/fs/cgroup/memory"), 1)
    assert find_controller("cpu", v1) is None
    (tmp_path / "job" / "step").mkdir(parents=True)
    mine = "4:memory:/job/step\n1:cpu:/\n0::/other\n"
    assert own_group(Controller(tmp_path, 1), "memory", mine) == tmp_path / "job" / "step"
    assert own_group(Controller(tmp_path, 2), "memory", "0::/job\n") == tmp_path / "job"
    # a group that is not there (another mount namespace): the root
    assert own_group(Controller(tmp_path, 1), "memory", "4:memory:/gone\n") == tmp_path


@pytest.mark.parametrize("version", [1, 2])
def test_groups_are_made_with_the_limit_read_and_removed(tmp_path: Path, version: int) -> None:
    root = tmp_path / "memory"
    root.mkdir()
    (root / "cgroup.subtree_control").write_text("")
    with memory_groups(300 * 2**20, 2, Controller(root, version)) as groups:
        rank1 = groups.folder / "rank1"
        limit = "memory.limit_in_bytes" if version == 1 else "memory.max"
        assert (rank1 / limit).read_text() == str(300 * 2**20)
        # the kernel's counters, as it writes them
        if version == 1:
            (rank1 / "memory.oom_control").write_text(
                "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
            )
            (rank1 / "memory.max_usage_in_bytes").write_text("314572800\n")
        else:
            (rank1 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
            (rank1 / "memory.peak").write_text("314572800\n")
        assert not groups.oom_killed(0) and groups.oom_killed(1)
        assert groups.peak(0) is None and groups.peak(1) == 300 * 2**20
        for f in rank1.iterdir():  # the kernel's files go with the group
            f.unlink()
        for f in (groups.folder / "rank0").iterdir():
            f.unlink()
        if version == 2:
            (groups.folder / "cgroup.subtree_control").unlink()
    assert not groups.folder.exists()


def test_no_controller_or_no_right_to_make_groups_is_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a group cannot be made inside a file
    with pytest.raises(JimuError) as e, memory_groups(2**30, 1, Controller(blocked, 1)):
        pass
    assert str(e.value).startswith(f"--memory-limit cannot create memory cgroups under {blocked}")
    assert "\n" not in str(e.value)


def test_a_jobs_limit_is_the_tightest_of_its_groups() -> None:
    found = group_limit()
    assert found is None or found[0] > 0


def _real_controller() -> Controller | None:
    found = find_controller("memory")
    if found is None or found.version != 1 or os.geteuid() != 0:
        return None
    return found


def _jimu(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "deepjimu", "train", "--strategy", "ddp", "--workers", "2",
            "--model", "mlp:2048x3", "--epochs", "2", "--quiet", "--runs-dir", str(tmp_path),
            "--name", name, *args,
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(
    _real_controller() is None, reason="needs root and a mounted v1 memory cgroup controller"
)
def test_a_worker_past_its_budget_ends_the_run_in_one_line_and_one_within_it_runs(
    tmp_path: Path,
) -> None:
    controller = _real_controller()
    assert controller is not None
    parent = own_group(controller, "memory")
    before = {p.name for p in parent.glob("deepjimu-*")}
    # mlp:2048x3 with Adam: about 277 MB predicted, within 30% of 220 MB so the run starts;
    # the workers reach 300-340 MB (measured), and the kernel ends one
    killed = _jimu(tmp_path, "small", "--memory-limit", "220M")
    assert killed.returncode == 3  # OutOfMemory
    line = killed.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: worker [01] passed its memory budget of 220\.0 MB \(--memory-limit\) and the "
        r"kernel's out-of-memory killer ended it \(its peak: 220\.0 MB; predicted: \d+\.\d MB\); "
        rf"{re.escape(str(tmp_path / 'small'))} has no checkpoint yet",
        line,
    ), killed.stderr
    # the run folder says why it stopped, and holds no half-written file
    assert (tmp_path / "small" / "worker-errors.log").read_text().startswith(line[7:])
    assert not list((tmp_path / "small").glob("*.tmp*"))
    fits = _jimu(tmp_path, "large", "--memory-limit", "1G")
    assert fits.returncode == 0, fits.stderr
    summary = json.loads((tmp_path / "large" / "summary.json").read_text())
    assert summary["memory_limit_mb"] == 1024.0
    assert all(0 < p <= 1024 for p in summary["budget_peak_mb_per_rank"])
    assert groups_left(parent, before) == set()  # the groups are gone


def test_a_kill_counted_by_the_jobs_own_group_is_named_as_out_of_memory(tmp_path: Path) -> None:
    from deepjimu.preflight import Budget

    group = tmp_path / "job"
    group.mkdir()
    (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_kills(group) == 2 and oom_kills(tmp_path) is None
    run = tmp_path / "run"
    run.mkdir()
    before = Budget(job=(group, 2))
    assert before.line(2, run, killed=1) is None  # no kill since the run started
    after = Budget(job=(group, 1))
    assert after.line(2, run, killed=None) is None  # no worker was ended by SIGKILL
    line = after.line(2, run, killed=1)
    assert line is not None and line.startswith(
        f"worker 1 was ended by the kernel's out-of-memory killer: the memory cgroup {group}"
    )
    assert line.endswith(f"ran out; {run} has no checkpoint yet")


def test_a_killed_worker_of_a_split_names_the_largest_workers_prediction_too(
    tmp_path: Path,
) -> None:
    # a split model is cut at run time by measured times: the worker the kernel ended may
    # hold the part the prediction gave another (model-parallel x2 on mlp:6144x4: rank 0
    # predicted 956 MB under the FLOPs' cut, ended at 1.5 GB, rank 1 predicted 1.5 GB)
    from deepjimu.budget import MemoryGroups
    from deepjimu.preflight import Budget

    for rank, (killed, peak) in enumerate([(1, 1536), (0, 900)]):
        group = tmp_path / "groups" / f"rank{rank}"
        group.mkdir(parents=True)
        (group / "memory.oom_control").write_text(
            f"oom_kill_disable 0\nunder_oom 0\noom_kill {killed}\n"
        )
        (group / "memory.max_usage_in_bytes").write_text(f"{peak * 2**20}\n")
    groups = MemoryGroups(Controller(tmp_path, 1), tmp_path / "groups", 1536 * 2**20)
    run = tmp_path / "run"
    run.mkdir()
    line = Budget(groups, need=(956 * 2**20, 1530 * 2**20)).line(2, run)
    assert line == (
        "worker 0 passed its memory budget of 1.5 GB (--memory-limit) and the kernel's "
        "out-of-memory killer ended it (its peak: 1.5 GB; predicted: 956.0 MB as the "
        "prediction cut the model, 1.5 GB for its largest worker); "
        f"{run} has no checkpoint yet"
    )
    even = Budget(groups, need=(1530 * 2**20, 1530 * 2**20)).line(2, run)
    assert even is not None and "predicted: 1.5 GB); " in even
