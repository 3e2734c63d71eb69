"""The run folder: one run at a time (an OS lock), new runs only in a free folder, resumes as the checkpoint says.

No torch import here: the CLI reads a run's saved config before torch loads (under
torchrun the thread plan must be in the environment first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from deepjimu.atomic import atomic_write_text, no_space, space_error
from deepjimu.config import CONFIG_VERSION, ConfigErrors, RunConfig
from deepjimu.errors import JimuError
from deepjimu.launchers import slurm_job

__all__ = [
    "MORE_ROOM",
    "RESUME_KEEPS",
    "check_new",
    "check_resume",
    "claim_for_job",
    "kept_line",
    "latest_checkpoint",
    "lock_run_dir",
    "requeued",
    "saved_config",
    "stopped_line",
]

# what to do when the run folder's disk has no room left (after "free space there or")
MORE_ROOM = "pick a --runs-dir on a disk with room"

# what a resumed run must share with its checkpoint: the state's shapes (strategy, workers,
# model) and the data it was trained on (the split depends on the seed and the fractions)
RESUME_KEEPS = (
    "strategy",
    "workers",
    "dataset",
    "model",
    "seed",
    "val_fraction",
    "downsample",
    "classes",
    "normalize",
    "synthetic_n",
    "synthetic_features",
    "synthetic_classes",
    "train_fraction",
    "patch",
)


# the Slurm job that started the run in a folder (its SLURM_JOB_ID): a requeued job, which
# keeps its id, goes on there (requeued)
_SLURM_JOB = ".slurm-job"


def latest_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The folder and ``meta.json`` of the latest complete checkpoint of ``run_dir``, or None.

    Raises:
        JimuError: ``latest`` names a folder that is missing or has a damaged ``meta.json``.
    """
    latest = Path(run_dir) / "checkpoint" / "latest"
    if not latest.exists():
        return None
    folder = latest.parent / latest.read_text().strip()
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if not isinstance(meta, dict) or not {"step", "epoch", "world"} <= meta.keys():
            raise ValueError("not a checkpoint's meta.json")
    except (OSError, ValueError) as e:
        raise JimuError(f"checkpoint {folder} is damaged: {e}") from None
    return folder, meta


def saved_config(run_dir: Path) -> dict[str, Any]:
    """The options a run folder was last started with: its ``config.json``, else its checkpoint's.

    Raises:
        JimuError: the folder holds neither (not a run folder), or a damaged file.
    """
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if path.exists():
        try:
            value = json.loads(path.read_text())
            if isinstance(value, dict):
                return _known_options(value, run_dir, path)
        except (OSError, ValueError):
            pass
    found = latest_checkpoint(run_dir)
    if found is not None and isinstance(found[1].get("config"), dict):
        return _known_options(found[1]["config"], run_dir, found[0] / "meta.json")
    if path.exists():
        raise JimuError(f"--resume: {path} is damaged and no checkpoint holds the run's options")
    raise JimuError(f"--resume {run_dir}: not a run folder (no {path})")


def _known_options(saved: dict[str, Any], run_dir: Path, path: Path) -> dict[str, Any]:
    """The saved options without their layout's version, refused in one line when another
    version of deepjimu wrote them (a newer layout, or an option this one does not have)."""
    options = dict(saved)
    version = options.pop("config_version", 1)  # runs saved before the version was kept: 1
    why = ""
    if not isinstance(version, int) or version > CONFIG_VERSION:
        why = (
            f"was written by a newer deepjimu (config_version {version}; this one reads "
            f"{CONFIG_VERSION} and older)"
        )
    elif unknown := sorted(set(options) - {f.name for f in dataclasses.fields(RunConfig)}):
        why = f"holds option(s) this deepjimu does not know ({', '.join(unknown)})"
    if why:
        raise JimuError(
            f"--resume {run_dir}: {path} {why}; resume it with the deepjimu that wrote it, "
            "or start a new run"
        )
    return options


def check_resume(cfg: RunConfig) -> None:
    """Refuse a resume that its checkpoint contradicts, before anything is written.

    The checkpoint's options are the truth: a resumed run keeps every option of
    :data:`RESUME_KEEPS`, and trains to ``--epochs`` no fewer than the checkpoint's.

    Args:
        cfg: the validated options of the resumed run (``cfg.resume`` set).

    Raises:
        ConfigErrors: one line per contradicting option, naming both values.
        JimuError: the folder has no checkpoint, or a damaged one.
    """
    assert cfg.resume
    folder = Path(cfg.resume)
    found = latest_checkpoint(folder)
    if found is None:
        raise JimuError(f"--resume {folder}: no checkpoint in {folder / 'checkpoint'}")
    ckpt, meta = found
    saved = meta.get("config") or saved_config(folder)
    given = cfg.to_dict()
    problems = [
        f"--resume {folder}: --{k.replace('_', '-')} {_text(given[k])} contradicts the "
        f"checkpoint's {_text(saved[k])} ({ckpt})"
        for k in RESUME_KEEPS
        if k in saved and given[k] != saved[k]
    ]
    if cfg.epochs is not None and cfg.epochs < meta["epoch"]:
        problems.append(
            f"--resume {folder}: --epochs {cfg.epochs} is below the checkpoint's epoch "
            f"{meta['epoch']} ({ckpt}); give --epochs {meta['epoch']} or more"
        )
    if problems:
        raise ConfigErrors(problems)


def _text(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)


def check_new(run_dir: Path) -> None:
    """Refuse to start a new run in a folder that already holds one.

    Raises:
        JimuError: ``events.jsonl`` or ``summary.json`` exists.
    """
    if (run_dir / "events.jsonl").exists() or (run_dir / "summary.json").exists():
        raise JimuError(
            f"run folder {run_dir} already holds a run; pick another --name or --resume it"
        )


@contextlib.contextmanager
def lock_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``<run_dir>/.lock`` for the block: an exclusive ``flock`` that the OS releases
    when this process ends, however it ends (kill -9 included), so no stale lock survives.

    The folder is created if missing.

    Raises:
        JimuError: another process holds the lock (its pid is named), or the folder cannot
            be created, or its disk has no room for the lock's few bytes.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise JimuError(f"cannot create run folder {run_dir}: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise JimuError(
                f"run folder {run_dir} is in use by another run (pid {holder}); "
                "wait for it to end or pick another --name"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:
            if no_space(e):
                raise space_error(
                    run_dir, e, f"cannot start a run in {run_dir}", MORE_ROOM
                ) from None
            raise
        yield
    finally:
        os.close(fd)  # releases the lock


def claim_for_job(run_dir: Path, environ: Mapping[str, str] = os.environ) -> None:
    """Under Slurm, record the job in ``run_dir`` (the run's holder of the lock writes it),
    so that the job goes on there after a requeue (:func:`requeued`); elsewhere nothing."""
    job = slurm_job(environ)
    if job is not None:
        atomic_write_text(run_dir / _SLURM_JOB, f"{job[0]}\n")


def requeued(run_dir: Path, environ: Mapping[str, str] = os.environ) -> int:
    """How often Slurm requeued this job (SLURM_RESTART_COUNT) where ``run_dir`` holds the
    run this job started: the run goes on from its latest checkpoint (from the start where
    it has none). 0 for a first start, outside Slurm, and for a folder that another job
    started (a new run must not take it over, whatever its restart count).

    Example:
        >>> requeued(Path("runs/none"), {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"})
        0
    """
    job = slurm_job(environ)
    if job is None or job[1] == 0:
        return 0
    try:
        started_by = (run_dir / _SLURM_JOB).read_text().strip()
    except OSError:
        return 0
    return job[1] if started_by == job[0] else 0


def stopped_line(signum: int, out_dir: Path, again: str = "jimu train", every: bool = True) -> str:
    """What the user reads when a signal stopped the run: which, and what is kept.

    Args:
        signum: the signal.
        out_dir: the run folder.
        again: the command that goes on, before ``--resume`` (``srun -n 2 jimu train``).
        every: whether the launcher saw every worker end (said only where it did).
    """
    name = signal.Signals(signum).name
    ended = "; every worker ended" if every else ""
    return f"stopped by {name}{ended}; {kept_line(out_dir, again)}"


def kept_line(out_dir: Path, again: str = "jimu train") -> str:
    """What a run that ended early kept: its last checkpoint and how to go on, or none.

    Args:
        out_dir: the run folder.
        again: the command that goes on, before ``--resume`` (``srun -n 2 jimu train``).

    Example:
        >>> kept_line(Path("runs/new"))
        'runs/new has no checkpoint yet'
    """
    try:
        found = latest_checkpoint(out_dir)
    except JimuError:
        found = None
    if found is None:
        return f"{out_dir} has no checkpoint yet"
    return f"last checkpoint: {found[0]} (go on with: {again} --resume {out_dir})"
