"""Running a bench: validate its matrix, tune, run every configuration in its own process, write results, plots and report; ``--resume`` goes on."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import shlex
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from deepjimu.bench.flags import Options, option_argv
from deepjimu.bench.markdown import write_markdown
from deepjimu.bench.matrix import Cell, plan, split_variants, train_config, train_options
from deepjimu.bench.options import BenchOptions, bench_command, bench_options
from deepjimu.bench.plots import write_plots
from deepjimu.bench.record import read_back, recorded_tunings, resumed, write_record
from deepjimu.bench.results import (
    COLUMNS,
    Target,
    add_speedups,
    add_time_to_target,
    choose_target,
    options_text,
    write_csv,
)
from deepjimu.bench.runner import measure, run_cell, train_command
from deepjimu.bench.tune import Tuning, tune_group, tuned_keys
from deepjimu.choices import Family
from deepjimu.config import RunConfig
from deepjimu.data import dataset_family
from deepjimu.errors import Interrupted, JimuError
from deepjimu.flags import add_options
from deepjimu.record.folder import lock_run_dir
from deepjimu.record.read import ACCURACY, VAL_LOSS, read_summary

__all__ = ["bench_from_args", "run_bench"]


def bench_from_args(args: argparse.Namespace) -> Path:
    """Run the bench that ``jimu bench`` flags describe (or go on with ``--resume DIR``);
    returns its folder.

    Raises:
        JimuError: a bad option, or with ``--resume`` an option that differs from the
            bench's record (before any run starts).
    """
    if args.resume:
        return run_bench(resumed(args), resume=True)
    return run_bench(bench_options(args))


def run_bench(opts: BenchOptions, resume: bool = False) -> Path:
    """Run every cell of ``opts``' matrix in its own process, then write results and report.

    Every configuration is validated first, as ``jimu train`` validates it.
    ``results.csv`` is rewritten after every run. A run that fails or times out is recorded
    with its one-line error and the bench goes on. Stopped by SIGINT or SIGTERM, the bench
    stops the running configuration, marks it interrupted and writes results, report and
    plots of what finished; ``resume`` then runs only the configurations without a result
    (those that finished are read back). Once everything is written, the bench fails if
    any run did.

    Args:
        opts: the matrix and the options shared by every run.
        resume: go on with the bench in ``opts.out_dir`` (its record matches ``opts``).

    Returns:
        the bench folder (``opts.out_dir``).

    Raises:
        JimuError: the folder already holds a bench (without ``resume``), bad train options,
            a configuration that ``jimu train`` would refuse (one line each; impossible
            combinations are skipped, not refused), ``--tune`` with an option it tunes given
            as well, or (at the end) a run of the matrix that failed or timed out, named.
        Interrupted: stopped by a signal, once what finished is written.
    """
    out = opts.out_dir
    if not resume and (out / "results.csv").exists():
        raise JimuError(
            f"bench folder {out} already holds results; pick another --name, "
            f"or go on with: jimu bench --resume {out}"
        )
    base = {
        "dataset": opts.dataset,
        "data_dir": opts.data_dir,
        "seed": opts.seed,
        "epochs": opts.epochs,
    }
    fixed, variants = split_variants(opts.flags)
    try:
        extra = shlex.split(opts.train_args)
    except ValueError as e:
        raise JimuError(
            f"--train-args cannot be split into flags: {e} (got {opts.train_args!r})"
        ) from None
    train = fixed + train_options(extra)  # every run's options: the flags, then --train-args
    cfg = train_config(train, base)
    if opts.tune:
        given = set(opts.flags) | set(vars(_given_train_flags(extra)))
        clash = sorted(tuned_keys(opts.strategies, cfg, opts.tune) & given)
        if clash:
            names = ", ".join("--" + k.replace("_", "-") for k in clash)
            raise JimuError(f"--tune sets {names} itself; do not give it as well")
    cells = plan(
        cfg, list(opts.strategies), list(opts.workers), list(opts.models), variants,
        fixed=[k for k, _ in train],
    )  # fmt: skip
    for cell in cells:
        if cell.dropped and not cell.skip:
            left = ", ".join("--" + k.replace("_", "-") for k in cell.dropped)
            print(f"{cell.label}: {left} left out (applies elsewhere in this bench, not here)")
    with lock_run_dir(out):  # a second bench, or --resume, in this folder meanwhile is refused
        return _run(opts, resume, cells, cfg, train)


def _run(
    opts: BenchOptions, resume: bool, cells: list[Cell], cfg: RunConfig, train: Options
) -> Path:
    """:func:`run_bench` once the matrix is checked and the bench folder is locked."""
    out = opts.out_dir
    try:
        tunings = recorded_tunings(out) if resume else None
        if not resume:
            write_record(opts, None)
    except OSError as e:
        raise JimuError(f"cannot write bench folder {out}: {e.strerror}") from None
    t0 = time.perf_counter()
    rows = [_row(c, ()) for c in cells]
    current: dict[str, Any] | None = None
    stopped: KeyboardInterrupt | None = None
    try:
        if opts.tune and tunings is None:
            shutil.rmtree(out / "tune", ignore_errors=True)  # a stopped tuning starts again
            tunings = _tune(cells, cfg, opts, train)
            write_record(opts, tunings)
        chosen = {(t.strategy, t.model, t.options): t.choice for t in tunings or []}
        rows = [_row(c, chosen.get(c.group, ())) for c in cells]
        todo = _pending(opts, resume, cells, rows)
        for i, (cell, row) in enumerate(todo, start=1):
            cmd = _announce_cell(opts, resume, cell, row, train, chosen, i, len(todo))
            current = row
            _run_one(opts, cell, row, cmd)
            current = None
            print(_progress_text(row), flush=True)
            add_speedups(rows)
            write_csv(rows, out / "results.csv")
    except KeyboardInterrupt as e:  # Interrupted (SIGINT, SIGTERM) or a bare Ctrl-C
        stopped = e
        if current is not None:
            current.update(status="interrupted", error=_signal_name(e))
        print(flush=True)
    _report(opts, resume, cells, rows, train, tunings, t0, stopped)
    _raise_unfinished(cells, rows, out, stopped)
    return out


def _pending(
    opts: BenchOptions, resume: bool, cells: list[Cell], rows: list[dict[str, Any]]
) -> list[tuple[Cell, dict[str, Any]]]:
    """The configurations still to run, each with its row (a resume reads back the finished
    ones first); prints how many."""
    done = read_back(cells, rows, opts.out_dir) if resume else 0
    todo = [(c, r) for c, r in zip(cells, rows, strict=True) if r["status"] == "pending"]
    skipped = sum(1 for c in cells if c.skip)
    print(
        f"bench {opts.name}: {len(todo)} runs"
        + (f" ({done} finished before, read back)" if resume else "")
        + f", {skipped} impossible combinations skipped",
        flush=True,
    )
    return todo


def _announce_cell(
    opts: BenchOptions,
    resume: bool,
    cell: Cell,
    row: dict[str, Any],
    train: Options,
    chosen: dict[tuple[str, str, Options], Options],
    i: int,
    n: int,
) -> list[str]:
    """The ``jimu train`` command of ``cell``, its stopped attempt's folder cleared, its
    progress line begun (run ``i`` of ``n``)."""
    runs_dir = opts.out_dir / "runs"
    argv = cell.argv(train, chosen.get(cell.group, ()))
    cmd = train_command(cell, runs_dir, opts.dataset, opts.data_dir, opts.seed, opts.epochs, argv)
    if resume:  # the stopped attempt's folder: this run replaces it
        shutil.rmtree(runs_dir / cell.name, ignore_errors=True)
    print(f"[{i}/{n}] {cell.label} {row['tuned'] or ''}...", end=" ", flush=True)
    return cmd


def _run_one(opts: BenchOptions, cell: Cell, row: dict[str, Any], cmd: list[str]) -> None:
    """Run ``cmd`` and fill ``row`` with how it ended and, if it finished, its figures."""
    out = opts.out_dir
    runs_dir = out / "runs"
    outcome = run_cell(cmd, out / "logs", cell.name, opts.timeout)
    row.update(
        status=outcome.status,
        error=outcome.error,
        wall_s=outcome.wall_s,
        run_dir=str(runs_dir / cell.name),
        log=str(out / "logs" / f"{cell.name}.stderr.log"),
    )
    if outcome.status == "ok":
        try:
            row.update(measure(runs_dir / cell.name))
        except JimuError as e:
            row.update(status="failed", error=str(e))


def _report(
    opts: BenchOptions,
    resume: bool,
    cells: list[Cell],
    rows: list[dict[str, Any]],
    train: Options,
    tunings: list[Tuning] | None,
    t0: float,
    stopped: KeyboardInterrupt | None,
) -> None:
    """Print the skips, then write ``results.csv`` (with speedups and time to target), the
    plots and ``report.md`` (``t0``: when the bench started)."""
    out = opts.out_dir
    for c in cells:
        if c.skip:
            print(f"skipped {c.label}: {c.skip}")
    add_speedups(rows)
    target = _target(opts, rows)
    add_time_to_target(rows, target)
    write_csv(rows, out / "results.csv")
    title = f"{opts.dataset}, seed {opts.seed}, " + (
        f"{opts.epochs} epoch{'s' if opts.epochs != 1 else ''}" if opts.epochs else "default epochs"
    )
    plots = write_plots(rows, out, title, target)
    setup = _setup(opts, resume, train, target, t0, stopped)
    write_markdown(out / "report.md", rows, setup, plots, tunings)
    print(f"wrote {out / 'results.csv'} and {out / 'report.md'}")


def _target(opts: BenchOptions, rows: list[dict[str, Any]]) -> Target:
    """The bench's time-to-target: a validation loss when ``--target-loss`` is given or, with
    no target given, on text data (a language model's accuracy says little); else a test
    accuracy."""
    text = dataset_family(opts.dataset) == Family.TEXT
    if opts.target_loss is not None or (text and opts.target_acc is None):
        return choose_target(rows, opts.target_loss, VAL_LOSS)
    return choose_target(rows, opts.target_acc, ACCURACY)


def _setup(
    opts: BenchOptions,
    resume: bool,
    train: Options,
    target: Target,
    t0: float,
    stopped: KeyboardInterrupt | None,
) -> dict[str, Any]:
    """What all runs of the bench shared, for the report (:func:`write_markdown`)."""
    out = opts.out_dir
    return {
        "name": opts.name,
        "command": bench_command(opts),
        "dataset": opts.dataset,
        "seed": opts.seed,
        "epochs": opts.epochs,
        "target": target,
        "train_args": shlex.join(option_argv(train)),
        "host": f"{platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs)",
        "date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
        "elapsed_s": time.perf_counter() - t0,
        "resumed": f"jimu bench --resume {out}" if resume else None,
        "interrupted": None
        if stopped is None
        else f"{_signal_name(stopped)}; go on with: jimu bench --resume {out}",
    }


def _raise_unfinished(
    cells: list[Cell], rows: list[dict[str, Any]], out: Path, stopped: KeyboardInterrupt | None
) -> None:
    """End a bench that a signal stopped, or whose runs failed or timed out, in one line."""
    ran = [r for r in rows if r["status"] != "skipped"]
    if stopped is not None:
        finished = sum(1 for r in ran if r["status"] == "ok")
        signum = stopped.signum if isinstance(stopped, Interrupted) else signal.SIGINT
        raise Interrupted(
            signum,
            f"{_signal_name(stopped)}; {finished} of {len(ran)} configurations finished, "
            f"written to {out / 'report.md'} (go on with: jimu bench --resume {out})",
        )
    failed = [
        f"{c.label} ({r['status']})"
        for c, r in zip(cells, rows, strict=True)
        if r["status"] in ("failed", "timeout")
    ]
    if failed:
        raise JimuError(
            f"{len(failed)} of {len(ran)} runs failed: {', '.join(failed)}; "
            f"their errors are in {out / 'report.md'}"
        )


def _signal_name(e: KeyboardInterrupt) -> str:
    """``stopped by SIGINT`` (SIGTERM, ...)."""
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    return f"stopped by {signal.Signals(signum).name}"


def _given_train_flags(argv: list[str]) -> argparse.Namespace:
    """The options set in ``--train-args`` (only their names matter here)."""
    p = argparse.ArgumentParser(add_help=False)
    add_options(p)
    args, _ = p.parse_known_args(argv)
    return args


def _tune(cells: list[Cell], cfg: Any, opts: BenchOptions, train: Options) -> list[Tuning]:
    """Run the tuning trials of every group of ``cells``; print them as they finish."""
    groups: dict[tuple[str, str, Options], list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.group, []).append(c)
    runs_dir, logs = opts.out_dir / "tune" / "runs", opts.out_dir / "tune" / "logs"

    def run_trial(cell: Cell, setting: Options) -> tuple[str, str, float | None]:
        trial = dataclasses.replace(cell, options=cell.options + setting)
        argv = trial.argv(train)
        cmd = train_command(
            trial, runs_dir, opts.dataset, opts.data_dir, opts.seed, opts.epochs, argv
        )
        print(f"tune {trial.label} ...", end=" ", flush=True)
        outcome = run_cell(cmd, logs, trial.name, opts.timeout)
        status, error, val = outcome.status, outcome.error, None
        if status == "ok":
            val = (read_summary(runs_dir / trial.name) or {}).get("val_acc")
            if val is None:
                status, error = "failed", "no validation accuracy (is --val-fraction 0?)"
        print(f"val_acc {val:.4f}" if val is not None else f"{status}: {error}", flush=True)
        return status, error, val

    tunings = []
    for group in groups.values():
        t = tune_group(group, cfg, opts.tune, run_trial)
        if t is not None:
            tunings.append(t)
            print(f"tuned {t.strategy} {t.model}: {options_text(t.choice) or 'nothing ran'}")
    return tunings


def _progress_text(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['status']} after {row['wall_s']:.1f} s: {row['error']}"
    acc, loss, sps = row.get("test_acc"), row.get("val_loss"), row.get("samples_per_s")
    if acc is None or sps is None:
        return f"ok in {row['wall_s']:.1f} s"
    shown = "" if loss is None else f"val_loss {loss:.4f}, "
    return f"ok in {row['wall_s']:.1f} s ({shown}test_acc {acc:.4f}, {sps:.0f} samples/s)"


def _row(cell: Cell, tuned: Options) -> dict[str, Any]:
    return {c: None for c in COLUMNS} | {
        "strategy": cell.strategy,
        "workers": cell.workers,
        "model": cell.model,
        "options": options_text(cell.options),
        "tuned": options_text(tuned),
        "status": "skipped" if cell.skip else "pending",
        "error": cell.skip or "",
    }
