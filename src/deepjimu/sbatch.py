"""``jimu sbatch``: a Slurm batch script that runs ``srun jimu train ...`` on every task, and its submission.

Each task of the job is one worker (:mod:`deepjimu.launchers`); rank 0 writes the run
folder, which every node must see. The script names the run (a default name would be made
anew by a requeued job), and a job submitted with ``--requeue`` goes on by itself from the
folder's last checkpoint when Slurm requeues it (:func:`deepjimu.record.folder.requeued`).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from deepjimu.bench.flags import option_argv
from deepjimu.config import RunConfig, field_kind, option_fields
from deepjimu.errors import JimuError
from deepjimu.launch import joined_config
from deepjimu.launchers import Launcher, Placement
from deepjimu.validation import validate
from deepjimu.worker import default_run_name

__all__ = ["BatchJob", "batch_script", "sbatch_from_args"]

# Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile(r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|INFINITE|UNLIMITED")
_PARTITION = re.compile(r"[A-Za-z0-9_.,-]+")
_SBATCH_TIMEOUT_S = 60


@dataclasses.dataclass(frozen=True)
class BatchJob:
    """What the batch script asks Slurm for: ``nodes`` x ``tasks_per_node`` tasks, one worker each."""

    nodes: int = 1
    tasks_per_node: int = 1
    time: str | None = None
    partition: str | None = None
    requeue: bool = False

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node


def batch_script(
    job: BatchJob, train_argv: Sequence[str], workdir: Path, python: str = sys.executable
) -> str:
    """The text of a batch script that runs ``srun <python> -m deepjimu train <train_argv>``.

    Every argument is quoted for the shell (:func:`shlex.quote`); the script changes to
    ``workdir`` first, so that relative paths (``--runs-dir``, ``--data-dir``) mean what
    they meant where it was written.

    Example:
        >>> batch_script(BatchJob(2, 4), ["--name", "a b"], Path("/w"), "py").splitlines()[-1]
        "srun py -m deepjimu train --name 'a b'"
    """
    name = next((train_argv[i + 1] for i, a in enumerate(train_argv[:-1]) if a == "--name"), None)
    lines = ["#!/bin/bash", "# written by jimu sbatch"]
    if name:  # Slurm reads directives itself, not through a shell: a plain name
        lines.append(f"#SBATCH --job-name={re.sub(r'[^A-Za-z0-9_.-]', '_', name)}")
    lines += [f"#SBATCH --nodes={job.nodes}", f"#SBATCH --ntasks-per-node={job.tasks_per_node}"]
    if job.time:
        lines.append(f"#SBATCH --time={job.time}")
    if job.partition:
        lines.append(f"#SBATCH --partition={job.partition}")
    if job.requeue:  # a requeued job appends to its output instead of starting it over
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    lines += [
        "",
        "# each task is one worker; rank 0 writes the run folder, which every node must see",
        "# (a shared file system). A requeued job goes on from the folder's last checkpoint.",
        f"cd -- {shlex.quote(str(workdir))}",
        shlex.join(["srun", python, "-m", "deepjimu", "train", *train_argv]),
        "",
    ]
    return "\n".join(lines)


def sbatch_from_args(args: argparse.Namespace, cfg: RunConfig) -> None:
    """``jimu sbatch``: check the job and ``cfg`` (its ``jimu train`` options), write the
    batch script, and with ``--submit`` submit it and print the job id.

    Raises:
        JimuError: a bad job option, options ``jimu train`` would refuse under srun, or a
            submission that failed (sbatch missing, or its error line).
    """
    job = _job(args, cfg)
    if job.tasks > 1:  # each task a worker: as the tasks will check it, before the queue
        place = Placement(Launcher.SLURM, world=job.tasks, local_world=job.tasks_per_node,
                          world_from="the job's --nodes x --tasks-per-node")  # fmt: skip
        validate(joined_config(cfg, place))
    else:  # one task: jimu train starts its own workers there
        validate(cfg)
    argv = _train_argv(args)
    if not cfg.resume and not cfg.name:  # a requeued job must find the same folder
        cfg = dataclasses.replace(cfg, name=default_run_name(cfg))
        argv += ["--name", str(cfg.name)]
    folder = Path(cfg.resume) if cfg.resume else Path(cfg.runs_dir) / str(cfg.name)
    script = Path(args.script) if args.script else folder.with_name(folder.name + ".sbatch")
    text = batch_script(job, argv, Path.cwd())
    try:
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(text)
    except OSError as e:
        raise JimuError(f"cannot write the batch script {script}: {e.strerror}") from None
    print(f"wrote {script}: {job.nodes} x {job.tasks_per_node} tasks, run folder {folder}")
    if args.submit:
        print(f"submitted batch job {submit(script)}")


def submit(script: Path) -> str:
    """Submit ``script`` with ``sbatch --parsable``; its job id.

    Raises:
        JimuError: sbatch is not on PATH, fails, or takes over a minute.
    """
    if shutil.which("sbatch") is None:
        raise JimuError(
            f"--submit needs Slurm's sbatch, which is not on PATH; submit {script} "
            "with sbatch where Slurm is"
        )
    try:
        r = subprocess.run(
            ["sbatch", "--parsable", str(script)],
            capture_output=True,
            text=True,
            timeout=_SBATCH_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise JimuError(f"sbatch {script} gave no answer in {_SBATCH_TIMEOUT_S} s") from None
    if r.returncode != 0:
        said = [x.strip() for x in r.stderr.splitlines() if x.strip()]
        raise JimuError(f"sbatch {script} failed: {said[-1] if said else f'exit {r.returncode}'}")
    return r.stdout.strip().split(";")[0]


def _job(args: argparse.Namespace, cfg: RunConfig) -> BatchJob:
    """The job of ``args``, checked."""
    if args.nodes < 1:
        raise JimuError(f"--nodes must be >= 1 (nodes: {args.nodes})")
    per_node = args.tasks_per_node
    if per_node is None:
        per_node = 1
        if cfg.workers is not None:
            if cfg.workers % args.nodes:
                raise JimuError(
                    f"--workers {cfg.workers} do not split evenly over --nodes {args.nodes}; "
                    "give --tasks-per-node"
                )
            per_node = max(1, cfg.workers // args.nodes)
    if per_node < 1:
        raise JimuError(f"--tasks-per-node must be >= 1 (tasks-per-node: {per_node})")
    if args.time is not None and not _TIME.fullmatch(args.time):
        raise JimuError(
            f"--time must be minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, as sbatch takes it "
            f"(time: {args.time!r})"
        )
    if args.partition is not None and not _PARTITION.fullmatch(args.partition):
        raise JimuError(
            f"--partition must be a Slurm partition name (partition: {args.partition!r})"
        )
    return BatchJob(args.nodes, per_node, args.time, args.partition, args.requeue)


def _train_argv(args: argparse.Namespace) -> list[str]:
    """The ``jimu train`` flags given to ``jimu sbatch`` (``--config`` first)."""
    kinds = {f.name: field_kind(f) for f in option_fields()}
    given = tuple(
        (k, str(v).lower() if kinds[k] == "bool" else str(v))
        for k, v in vars(args).items()
        if k in kinds
    )
    return (["--config", args.config] if args.config else []) + option_argv(given)
