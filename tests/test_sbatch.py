"""jimu sbatch: the batch script it writes, and its one-line refusals (submitting for real: tests/test_hpc.py)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from deepjimu.cli import main


def test_the_script_runs_srun_jimu_train_with_the_options_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["sbatch", "--strategy", "ddp", "--epochs", "3", "--quiet", "--name", "it's mine",
            "--nodes", "2", "--tasks-per-node", "3", "--time", "1-00:30:00",
            "--partition", "gpu"]  # fmt: skip
    assert main(argv) == 0
    script = tmp_path / "runs" / "it's mine.sbatch"
    assert capsys.readouterr().out == (
        f"wrote {Path('runs') / script.name}: 2 x 3 tasks, run folder runs/it's mine\n"
    )
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    assert [x for x in lines if x.startswith("#SBATCH")] == [
        "#SBATCH --job-name=it_s_mine", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=3",
        "#SBATCH --time=1-00:30:00", "#SBATCH --partition=gpu",
    ]  # fmt: skip
    assert f"cd -- {shlex.quote(str(tmp_path))}" in lines
    srun = shlex.split(lines[-1])
    assert srun == ["srun", sys.executable, "-m", "deepjimu", "train", "--strategy", "ddp",
                    "--epochs", "3", "--quiet", "--name", "it's mine"]  # fmt: skip


def test_a_run_without_a_name_gets_one_that_a_requeue_finds_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["sbatch", "--workers", "4", "--strategy", "ddp", "--requeue",
                 "--script", "job.sh"]) == 0  # fmt: skip
    text = (tmp_path / "job.sh").read_text()
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n" in text, "--workers / --nodes"
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in text
    srun = shlex.split(text.splitlines()[-1])
    assert srun[srun.index("--name") + 1].startswith("ddp-digits-")


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--nodes", "0"], "error: --nodes must be >= 1 (nodes: 0)"),
        (["--tasks-per-node", "0"], "error: --tasks-per-node must be >= 1 (tasks-per-node: 0)"),
        (["--workers", "3", "--nodes", "2"],
         "error: --workers 3 do not split evenly over --nodes 2; give --tasks-per-node"),
        (["--workers", "3", "--tasks-per-node", "2"],
         "error: --workers 3 disagrees with the job's --nodes x --tasks-per-node 2"),
        (["--time", "2h"], "error: --time must be minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, as "
         "sbatch takes it (time: '2h')"),
        (["--partition", "a b"],
         "error: --partition must be a Slurm partition name (partition: 'a b')"),
        (["--tasks-per-node", "2", "--max-restarts", "1"],
         "error: under srun, submit with sbatch --requeue instead: a requeued job goes on from "
         "its checkpoint (max-restarts: 1)"),
        (["--tasks-per-node", "8", "--strategy", "admm"],  # as each task would refuse it
         "error: strategy admm needs at least one block per worker (workers: 8, blocks in "
         "mlp:256x3: 4)"),
    ],
)  # fmt: skip
def test_a_bad_job_is_one_line_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    line: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["sbatch", "--strategy", "ddp", *flags]) == 2
    assert capsys.readouterr().err.splitlines() == [line]
    assert not (tmp_path / "runs").exists()


def test_submit_without_sbatch_is_one_line_after_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert main(["sbatch", "--name", "n", "--submit"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --submit needs Slurm's sbatch, which is not on PATH; submit runs/n.sbatch "
        "with sbatch where Slurm is\n"
    )
    assert (tmp_path / "runs" / "n.sbatch").exists(), "the script is kept, to submit elsewhere"
