"""Run one bench cell as its own ``jimu train`` process, and read its figures back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepjimu.bench.matrix import Cell
from deepjimu.clocks import CLOCKS
from deepjimu.errors import JimuError, OutOfMemory
from deepjimu.record.folder import MORE_ROOM
from deepjimu.record.read import (
    finite_number,
    read_events,
    read_summary,
    train_time_to,
)

__all__ = ["NO_FIT", "Outcome", "error_line", "measure", "run_cell", "train_command"]


NO_FIT = "does-not-fit"
"""The status of a configuration that its memory cannot hold (``jimu train`` exits 3)."""

# a run's advice on a full disk names its --runs-dir, which the bench sets under --bench-dir
_BENCH_ROOM = MORE_ROOM.replace("--runs-dir", "--bench-dir")


@dataclass
class Outcome:
    """How a run's process ended: ``status`` is ok, failed, timeout or :data:`NO_FIT` (the
    run's memory could not hold it: refused before it started, or a worker past its
    budget; a result, not a failure); ``error`` one line."""

    status: str
    error: str
    wall_s: float


def train_command(
    cell: Cell,
    runs_dir: Path,
    dataset: str,
    data_dir: str,
    seed: int,
    epochs: int | None,
    train_argv: list[str],
) -> list[str]:
    """The ``python -m deepjimu train ...`` command line of ``cell``.

    Example:
        >>> train_command(Cell("ddp", 2, "mlp:16x1"), Path("b/runs"), "digits", "data", 0, None, [])[3:7]
        ['--strategy', 'ddp', '--workers', '2']
    """
    cmd = [sys.executable, "-m", "deepjimu", "train"]
    cmd += ["--strategy", cell.strategy, "--workers", str(cell.workers), "--model", cell.model]
    cmd += ["--dataset", dataset, "--data-dir", data_dir, "--seed", str(seed)]
    if epochs is not None:
        cmd += ["--epochs", str(epochs)]
    cmd += ["--quiet", "--runs-dir", str(runs_dir), "--name", cell.name, *train_argv]
    return cmd


def error_line(stderr: str, returncode: int) -> str:
    """The one line that says why a run failed: the CLI's ``error:`` line, else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln.removeprefix("error:").strip() for ln in lines if ln.startswith("error:")]
    if errors:
        return errors[-1].replace(MORE_ROOM, _BENCH_ROOM)
    if lines:
        return lines[-1][:300]
    return f"exit code {returncode} without a message"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the run's process group (the launcher and its workers), politely first."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_cell(cmd: list[str], log_dir: Path, name: str, timeout: float) -> Outcome:
    """Run ``cmd`` in its own process group; stdout and stderr go to ``log_dir/<name>.*.log``.

    Args:
        cmd: the command (see :func:`train_command`).
        log_dir: folder for the logs (created).
        name: the cell's name, for the log files.
        timeout: seconds before the whole process group is ended.

    Returns:
        ok (exit 0), does-not-fit (exit 3, with the line that says why), failed (another
        nonzero exit, with the error line) or timeout.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{name}.stdout.log", log_dir / f"{name}.stderr.log"
    t0 = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return Outcome("timeout", f"timed out after {timeout:g} s", time.perf_counter() - t0)
        except BaseException:  # Ctrl-C: do not leave workers behind
            _kill_group(proc)
            raise
    wall = time.perf_counter() - t0
    if rc == OutOfMemory.exit_code:  # a result: this configuration does not fit its memory
        return Outcome(NO_FIT, error_line(err_path.read_text(errors="replace"), rc), wall)
    if rc != 0:
        return Outcome("failed", error_line(err_path.read_text(errors="replace"), rc), wall)
    return Outcome("ok", "", wall)


def measure(run_dir: Path, target_acc: float | None = None) -> dict[str, Any]:
    """The bench figures of a finished run folder.

    Returns:
        ``epochs``, the run's clocks ``time_s``, ``fit_s``, ``train_s`` and ``eval_s``
        (:data:`deepjimu.clocks.CLOCKS`), ``samples_per_s``, ``test_acc`` (final),
        ``time_to_target_s`` (``train_s`` of the first event whose test accuracy reaches
        ``target_acc``: evaluation is not counted, so a strategy that evaluates more often
        is not penalised), ``wall_to_target_s`` (``time_s`` of that event: seconds since
        the workers started, set-up and evaluations included; both None without a target),
        ``bytes_sent``,
        ``bytes_per_sample`` (bytes sent by all ranks per
        training sample processed), ``peak_mem_mb`` (max over ranks and events),
        ``budget_peak_mb`` (under ``--memory-limit`` on a CPU: the most a worker's memory
        group held, what the budget counts; else None),
        ``idle_frac`` and ``bubble_theory`` (pipeline only; None when absent).

    Raises:
        JimuError: the folder has no ``summary.json`` or a damaged file.
    """
    events = read_events(run_dir)
    summary = read_summary(run_dir)
    if summary is None:
        raise JimuError(f"{Path(run_dir) / 'summary.json'} does not exist")
    samples = finite_number(summary.get("samples")) or 0.0
    bytes_sent = finite_number(summary.get("bytes_sent"))
    if bytes_sent is None:
        bytes_sent = sum(finite_number(e.get("bytes_sent")) or 0.0 for e in events)
    to_target, wall_to_target = (
        train_time_to(events, target_acc) if target_acc is not None else (None, None)
    )
    mems = [m for e in [summary, *events] for m in e.get("peak_mem_mb_per_rank") or []]
    return {
        "epochs": summary.get("epochs"),
        **{k: finite_number(summary.get(k)) for k in CLOCKS},
        "samples_per_s": finite_number(summary.get("samples_per_s")),
        "test_acc": finite_number(summary.get("test_acc")),
        "val_loss": finite_number(summary.get("val_loss")),
        "time_to_target_s": to_target,
        "wall_to_target_s": wall_to_target,
        "bytes_sent": int(bytes_sent),
        "bytes_per_sample": bytes_sent / samples if samples else None,
        "peak_mem_mb": max((m for m in mems if finite_number(m) is not None), default=None),
        "budget_peak_mb": max(
            (m for m in summary.get("budget_peak_mb_per_rank") or [] if finite_number(m)),
            default=None,
        ),
        "idle_frac": _figure(summary, events, "idle_frac"),
        "bubble_theory": _figure(summary, events, "bubble_theory"),
    }


def _figure(summary: dict[str, Any], events: list[dict[str, Any]], key: str) -> float | None:
    """``key`` from the summary, else its mean over the events that carry it."""
    if finite_number(summary.get(key)) is not None:
        return finite_number(summary[key])
    values = [v for e in events if (v := finite_number(e.get(key))) is not None]
    return sum(values) / len(values) if values else None
