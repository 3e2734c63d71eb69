"""A real Slurm and a real OpenMPI: srun, sbatch and mpirun start jimu train's workers.

The reference runs are jimu's own launcher's (``jimu train --workers 2``) of the fault
tests' config (:data:`processes.FAULT`, made once per session by ``uninterrupted``).
Without the packages these tests are skipped with one line that says so; under
``.ci/run`` (DEEPJIMU_HPC_TESTS=required) that line fails them instead.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from deepjimu.launchers import expand_hostlist, job_port
from deepjimu.record.folder import latest_checkpoint
from hpc import TIMEOUT, Slurm, missing, mpi_env, start_slurm, tasks_of
from processes import FAULT, events, fault_flags, params, wait_for_epochs

# every test here runs real Slurm and OpenMPI jobs
pytestmark = pytest.mark.slow

JIMU = [sys.executable, "-m", "deepjimu"]
_SAME = ("step", "epoch", "loss", "train_acc", "val_acc", "test_acc", "bytes_sent", "bytes_recv")
_PLACE = (
    "import socket; from deepjimu.launchers import placement; p = placement(); "
    "print(p.launcher, p.rank, p.world, p.local_rank, p.local_world, p.master_addr, "
    "p.master_port, socket.gethostname().split('.')[0])"
)


def _require() -> None:
    why = missing()
    if why is None:
        return
    if os.environ.get("DEEPJIMU_HPC_TESTS") == "required":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """A one-node Slurm for the session (per test process), stopped at its end."""
    _require()
    cluster = start_slurm()
    try:
        yield cluster
    finally:
        cluster.stop()


def _train(strategy: str, tmp_path: Path, name: str, *extra: str) -> list[str]:
    return ["train", "--strategy", strategy, *fault_flags(strategy), *extra,
            "--runs-dir", str(tmp_path), "--name", name]  # fmt: skip


def _equals_uninterrupted(run: Path, ref: Path, resumed_by: str | None = None) -> None:
    """The run's events, summary and weights are the uninterrupted reference run's."""
    got, want = events(run), events(ref)
    assert [[e[k] for k in _SAME] for e in got] == [[e[k] for k in _SAME] for e in want]
    resumed = [e["resumed"]["by"] for e in got if "resumed" in e]
    assert resumed == ([resumed_by] if resumed_by else []), resumed
    summary = json.loads((run / "summary.json").read_text())
    ref_summary = json.loads((ref / "summary.json").read_text())
    for k in ("workers", "epochs", "steps", "test_acc", "val_acc", "bytes_sent"):
        assert summary[k] == ref_summary[k], k
    full, ours = params(ref), params(run)
    assert full.keys() == ours.keys()
    for k in full:
        assert torch.equal(full[k], ours[k]), k


def test_each_task_of_srun_sbatch_and_mpirun_is_placed_by_its_launcher(
    slurm: Slurm, tmp_path: Path
) -> None:
    """Tasks of one srun step join at the first node on the job's port; the batch step
    itself and srun -n 1 start jimu's own workers; mpirun's ranks join on this machine."""
    r = slurm.run(["srun", "-n", "3", "bash", "-c",
                   f"echo $SLURM_JOB_ID $({sys.executable} -c \"{_PLACE}\")"])  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    job, host = rows[0][0], rows[0][-1]
    assert rows == [[job, "slurm", str(i), "3", str(i), "3", host, str(job_port(job)), host]
                    for i in range(3)]  # fmt: skip
    one = slurm.run(["srun", "-n", "1", sys.executable, "-c", _PLACE])
    assert one.stdout.split()[:3] == ["local", "0", "1"], one.stderr
    script = tmp_path / "batch.sh"
    script.write_text(f'#!/bin/bash\n{sys.executable} -c "{_PLACE}"\n')
    out = tmp_path / "batch.out"
    r = slurm.run(["sbatch", "--wait", "-n", "2", "-o", str(out), str(script)])
    assert r.returncode == 0, r.stderr
    assert out.read_text().split()[:3] == ["local", "0", "1"], "the batch step is no task"
    r = slurm.run(["scontrol", "show", "hostnames", "node[01-03,07],r[1-2]-n[08-09],gpu[9-10]"])
    assert r.stdout.split() == expand_hostlist("node[01-03,07],r[1-2]-n[08-09],gpu[9-10]")
    # each rank's line to a file of its own: mpirun forwards the ranks' output in chunks,
    # which can interleave within a line
    each = f'{shlex.quote(sys.executable)} -c "{_PLACE}" > {tmp_path}/mpi.$OMPI_COMM_WORLD_RANK'
    m = _mpirun(["-np", "2", "bash", "-c", each])
    assert m.returncode == 0, m.stderr
    rows = sorted((tmp_path / f"mpi.{i}").read_text().split()[:6] for i in range(2))
    assert rows == [["mpi", str(i), "2", str(i), "2", "127.0.0.1"] for i in range(2)]


@pytest.mark.parametrize("strategy", ["ddp", "admm"])
def test_srun_trains_as_jimu_s_own_workers(
    slurm: Slurm, tmp_path: Path, uninterrupted: Callable[[str, int], Path], strategy: str
) -> None:
    """srun -n 2 jimu train: one run of two workers, the same as jimu train --workers 2."""
    r = slurm.run(["srun", "-n", "2", *JIMU, *_train(strategy, tmp_path, "s")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == "", "one run: no second run refused"
    _equals_uninterrupted(tmp_path / "s", uninterrupted(strategy, 2))
    assert (tmp_path / "s" / ".slurm-job").read_text().strip().isdigit()


def _mpirun(argv: list[str]) -> object:
    import subprocess

    return subprocess.run(["mpirun", "--oversubscribe", *argv], env=mpi_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip


def test_mpirun_trains_as_jimu_s_own_workers(
    slurm: Slurm, tmp_path: Path, uninterrupted: Callable[[str, int], Path]
) -> None:
    r = _mpirun(["-np", "2", *JIMU, *_train("ddp", tmp_path, "m")])
    assert r.returncode == 0, r.stderr[-3000:]  # type: ignore[attr-defined]
    _equals_uninterrupted(tmp_path / "m", uninterrupted("ddp", 2))


def _hold(name: str) -> None:
    """Stop the run's workers where they are (SIGSTOP), so that it cannot end before the
    scheduler's signal comes: Slurm sends SIGCONT before SIGTERM."""
    tasks = tasks_of(name)
    assert len(tasks) == 2, tasks
    for pid in tasks:
        os.kill(pid, signal.SIGSTOP)


def test_scancel_keeps_the_checkpoint_in_one_line_and_resume_equals_the_whole_run(
    slurm: Slurm, tmp_path: Path, uninterrupted: Callable[[str, int], Path]
) -> None:
    name, run = f"c-{uuid.uuid4().hex[:8]}", tmp_path / "c"
    proc = slurm.start(["srun", "-n", "2", "--job-name", name, *JIMU,
                        *_train("ddp", tmp_path, "c")])  # fmt: skip
    try:
        wait_for_epochs(run, 2, proc)
        _hold(name)
        assert slurm.run(["scancel", "--name", name], timeout=30).returncode == 0
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert len(events(run)) < FAULT["epochs"], "the run ended before it was cancelled"
    found = latest_checkpoint(run)
    assert found is not None, "the last checkpoint is kept"
    # srun's and slurmstepd's own lines aside, the run says one line
    ours = [x for x in err.splitlines() if x.strip() and not x.startswith(("srun:", "slurmstepd"))]
    assert ours == [
        f"error: stopped by SIGTERM; last checkpoint: {found[0]} "
        f"(go on with: srun -n 2 jimu train --resume {run})"
    ], err[-3000:]
    r = slurm.run(["srun", "-n", "2", *JIMU, "train", "--resume", str(run)])
    assert r.returncode == 0, r.stderr[-3000:]
    _equals_uninterrupted(run, uninterrupted("ddp", 2), resumed_by="--resume")


def test_a_requeued_job_of_jimu_sbatch_goes_on_by_itself(
    slurm: Slurm, tmp_path: Path, uninterrupted: Callable[[str, int], Path]
) -> None:
    """jimu sbatch --requeue --submit; Slurm requeues the job mid-run (as after a node
    failure); the job starts again and goes on from its checkpoint to a whole run folder."""
    name = f"q-{uuid.uuid4().hex[:8]}"  # the run's, and so the job's
    run, script = tmp_path / name, tmp_path / f"{name}.sbatch"
    r = slurm.run([*JIMU, "sbatch", *_train("ddp", tmp_path, name)[1:], "--tasks-per-node", "2",
                   "--requeue", "--time", "5", "--submit"], timeout=60, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"wrote {script}: 1 x 2 tasks, run folder {run}"
    job = r.stdout.splitlines()[-1].removeprefix("submitted batch job ")
    assert job.isdigit(), r.stdout
    try:
        slurm.wait_for(job, ("RUNNING",))
        deadline_proc = _JobAlive(slurm, job)
        wait_for_epochs(run, 2, deadline_proc)  # type: ignore[arg-type]
        _hold(name)
        assert slurm.run(["scontrol", "requeue", job], timeout=30).returncode == 0
        state = slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))
    finally:
        slurm.run(["scancel", job], timeout=30)
    out = next(tmp_path.glob(f"slurm-{job}.out"), None)
    said = out.read_text()[-3000:] if out else ""
    assert state == "COMPLETED", said
    assert f"requeue 1: {run} goes on from its checkpoint" in said, said
    _equals_uninterrupted(run, uninterrupted("ddp", 2), resumed_by="requeue 1")


class _JobAlive:
    """What wait_for_epochs polls: ``poll()`` is None while the job has not ended."""

    def __init__(self, slurm: Slurm, job: str) -> None:
        self.slurm, self.job = slurm, job

    def poll(self) -> int | None:
        state = self.slurm.job_state(self.job)
        return None if state in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING") else 1

    def communicate(self) -> tuple[str, str]:
        return "", f"job {self.job} is {self.slurm.job_state(self.job)}"
