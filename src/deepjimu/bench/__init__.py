"""``jimu bench``: strategies x models x options x worker counts on the same data and seed.

Every configuration runs as its own ``python -m deepjimu train ... --quiet`` process, one
after the other, under ``<bench-dir>/<name>/runs/<configuration>``; the bench then writes
``results.csv``, ``report.md`` and PNG plots into ``<bench-dir>/<name>``. Any ``jimu train``
option is also a bench option; given a comma list (``--lr 1e-3,3e-3``, ``--precision
fp32,bf16``) it becomes one more matrix dimension. ``--tune`` first gives every strategy the
same number of trials of its tuned options on the validation split.

Example:
    jimu bench --strategies local,ddp --workers 1,2 --models mlp:64x2 --epochs 5
    jimu bench --dataset mnist --data-dir ../shared/data --downsample 2 --tune
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepjimu.bench.markdown import write_markdown
from deepjimu.bench.matrix import (
    BENCH_FLAGS,
    Cell,
    Options,
    option_argv,
    parse_list,
    parse_workers,
    plan,
    split_variants,
    train_config,
)
from deepjimu.bench.plots import write_plots
from deepjimu.bench.results import COLUMNS, add_speedups, options_text, write_csv
from deepjimu.bench.runner import measure, run_cell, train_command
from deepjimu.bench.tune import Tuning, tune_group, tuned_keys
from deepjimu.config import add_options, field_kind, option_fields
from deepjimu.errors import JimuError
from deepjimu.report import read_summary

__all__ = [
    "COLUMNS",
    "BenchOptions",
    "add_bench_arguments",
    "bench_command",
    "bench_from_args",
    "run_bench",
]

DEFAULT_STRATEGIES = "local,ddp,model-parallel,pipeline,admm"


@dataclass
class BenchOptions:
    """What one bench runs. ``epochs`` None: each strategy's default epochs."""

    name: str
    bench_dir: Path = Path("bench")
    strategies: tuple[str, ...] = tuple(DEFAULT_STRATEGIES.split(","))
    workers: tuple[int, ...] = (1, 2, 3)
    models: tuple[str, ...] = ("mlp:256x3",)
    dataset: str = "digits"
    data_dir: str = "data"
    epochs: int | None = None
    target_acc: float = 0.9
    seed: int = 0
    timeout: float = 300.0
    train_args: str = ""
    flags: dict[str, str] = field(default_factory=dict)
    tune: int = 0

    @property
    def out_dir(self) -> Path:
        """``<bench_dir>/<name>``."""
        return self.bench_dir / self.name


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``jimu bench`` options to ``p``."""
    p.add_argument(
        "--name", default=None, help="bench folder name (default: bench-YYYYmmdd-HHMMSS)"
    )
    p.add_argument(
        "--bench-dir", default="bench", help="folder that holds bench folders (default: bench)"
    )
    p.add_argument(
        "--strategies",
        default=DEFAULT_STRATEGIES,
        help=f"comma list (default: {DEFAULT_STRATEGIES})",
    )
    p.add_argument(
        "--workers", default="1,2,3", help="comma list of worker counts (default: 1,2,3)"
    )
    p.add_argument(
        "--models", default="mlp:256x3", help="comma list of model specs (default: mlp:256x3)"
    )
    p.add_argument("--dataset", default="digits", help="dataset of every run (default: digits)")
    p.add_argument("--data-dir", default="data", help="folder with dataset files (default: data)")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs of every run (default: each strategy's default)",
    )
    p.add_argument(
        "--target-acc",
        type=float,
        default=0.9,
        help="test accuracy for time-to-target, a fraction (default: 0.9)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every run (default: 0)")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds before a run is stopped and counted as timed out (default: 300)",
    )
    p.add_argument(
        "--train-args",
        default="",
        help='extra jimu train flags for every run, as one string, e.g. "--microbatches 8"',
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="first tune every strategy on the validation split with the same number of trials "
        "(gradient strategies: lr; admm: rho and nu), then run the matrix at the chosen settings",
    )
    p.add_argument(
        "--tune-trials", type=int, default=5, help="trials per strategy for --tune (default: 5)"
    )
    train = p.add_argument_group(
        "jimu train options",
        "any jimu train option, for every run; a comma list (--lr 1e-3,3e-3) is a matrix dimension",
    )
    add_options(train, exclude=BENCH_FLAGS)


def bench_from_args(args: argparse.Namespace) -> Path:
    """Run the bench that ``jimu bench`` flags describe; returns its folder.

    Raises:
        JimuError: a bad option (before any run starts).
    """
    name = args.name or f"bench-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    if args.epochs is not None and args.epochs < 1:
        raise JimuError(f"--epochs must be >= 1 (epochs: {args.epochs})")
    if not 0 < args.target_acc <= 1:
        raise JimuError(
            f"--target-acc must be a fraction in (0, 1] (target-acc: {args.target_acc})"
        )
    if args.timeout <= 0:
        raise JimuError(f"--timeout must be > 0 seconds (timeout: {args.timeout})")
    if args.tune_trials < 1:
        raise JimuError(f"--tune-trials must be >= 1 (tune-trials: {args.tune_trials})")
    kinds = {f.name: field_kind(f) for f in option_fields() if f.name not in BENCH_FLAGS}
    flags = {
        k: (str(v).lower() if kinds[k] == "bool" else str(v))
        for k, v in vars(args).items()
        if k in kinds
    }
    opts = BenchOptions(
        name=name,
        bench_dir=Path(args.bench_dir),
        strategies=tuple(parse_list(args.strategies, "strategies")),
        workers=tuple(parse_workers(args.workers)),
        models=tuple(parse_list(args.models, "models")),
        dataset=args.dataset,
        data_dir=args.data_dir,
        epochs=args.epochs,
        target_acc=args.target_acc,
        seed=args.seed,
        timeout=args.timeout,
        train_args=args.train_args,
        flags=flags,
        tune=args.tune_trials if args.tune else 0,
    )
    return run_bench(opts)


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


def bench_command(opts: BenchOptions) -> str:
    """The ``jimu bench`` command line that repeats ``opts`` (for the report)."""
    argv = ["--name", opts.name, "--bench-dir", str(opts.bench_dir)]
    argv += [
        "--strategies",
        ",".join(opts.strategies),
        "--workers",
        ",".join(map(str, opts.workers)),
    ]
    argv += [
        "--models",
        ",".join(opts.models),
        "--dataset",
        opts.dataset,
        "--data-dir",
        opts.data_dir,
    ]
    argv += [
        "--seed",
        str(opts.seed),
        "--target-acc",
        f"{opts.target_acc:g}",
        "--timeout",
        f"{opts.timeout:g}",
    ]
    if opts.epochs is not None:
        argv += ["--epochs", str(opts.epochs)]
    if opts.tune:
        argv += ["--tune", "--tune-trials", str(opts.tune)]
    for k, v in opts.flags.items():
        argv += (
            option_argv(((k, v),)) if v in ("true", "false") else [f"--{k.replace('_', '-')}", v]
        )
    if opts.train_args:
        argv += ["--train-args", opts.train_args]
    return "jimu bench " + shlex.join(argv)


def run_bench(opts: BenchOptions) -> Path:
    """Run every cell of ``opts``' matrix in its own process, then write results and report.

    ``results.csv`` is rewritten after every run, so an interrupted bench keeps what it
    measured. A run that fails or times out is recorded with its one-line error and the
    bench goes on; once everything is written, the bench fails if any run did.

    Args:
        opts: the matrix and the options shared by every run.

    Returns:
        the bench folder (``opts.out_dir``).

    Raises:
        JimuError: the folder already holds a bench, bad train options, ``--tune`` with
            an option it tunes given as well, or (at the end) a run of the matrix that failed
            or timed out, named (impossible combinations are skipped, not failed).
    """
    out = opts.out_dir
    if (out / "results.csv").exists():
        raise JimuError(f"bench folder {out} already holds results; pick another --name")
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
    train_argv = option_argv(fixed) + extra
    cfg = train_config(train_argv, base)
    if opts.tune:
        given = set(opts.flags) | set(vars(_given_train_flags(extra)))
        clash = sorted(tuned_keys(opts.strategies, cfg, opts.tune) & given)
        if clash:
            names = ", ".join("--" + k.replace("_", "-") for k in clash)
            raise JimuError(f"--tune sets {names} itself; do not give it as well")
    cells = plan(cfg, list(opts.strategies), list(opts.workers), list(opts.models), variants)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise JimuError(f"cannot create bench folder {out}: {e.strerror}") from None
    t0 = time.perf_counter()
    tunings = _tune(cells, cfg, opts, train_argv) if opts.tune else []
    chosen = {(t.strategy, t.model, t.options): t.choice for t in tunings}
    runs_dir = out / "runs"
    rows = [_row(c, chosen.get(c.group, ())) for c in cells]
    todo = [(c, r) for c, r in zip(cells, rows, strict=True) if not c.skip]
    print(
        f"bench {opts.name}: {len(todo)} runs, {len(cells) - len(todo)} impossible combinations skipped",
        flush=True,
    )
    for i, (cell, row) in enumerate(todo, start=1):
        argv = train_argv + option_argv(cell.options + chosen.get(cell.group, ()))
        cmd = train_command(
            cell, runs_dir, opts.dataset, opts.data_dir, opts.seed, opts.epochs, argv
        )
        print(f"[{i}/{len(todo)}] {cell.label} {row['tuned'] or ''}...", end=" ", flush=True)
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
                row.update(measure(runs_dir / cell.name, opts.target_acc))
            except JimuError as e:
                row.update(status="failed", error=str(e))
        print(_progress_text(row), flush=True)
        add_speedups(rows)
        write_csv(rows, out / "results.csv")
    for c in cells:
        if c.skip:
            print(f"skipped {c.label}: {c.skip}")
    add_speedups(rows)
    write_csv(rows, out / "results.csv")
    title = f"{opts.dataset}, seed {opts.seed}, " + (
        f"{opts.epochs} epochs" if opts.epochs else "default epochs"
    )
    plots = write_plots(rows, out, title, opts.target_acc)
    setup = {
        "name": opts.name,
        "command": bench_command(opts),
        "dataset": opts.dataset,
        "seed": opts.seed,
        "epochs": opts.epochs,
        "target_acc": opts.target_acc,
        "train_args": shlex.join(train_argv),
        "host": f"{platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs)",
        "date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
        "elapsed_s": time.perf_counter() - t0,
    }
    write_markdown(out / "report.md", rows, setup, plots, tunings)
    print(f"wrote {out / 'results.csv'} and {out / 'report.md'}")
    failed = [f"{c.label} ({r['status']})" for c, r in todo if r["status"] != "ok"]
    if failed:
        raise JimuError(
            f"{len(failed)} of {len(todo)} runs failed: {', '.join(failed)}; "
            f"their errors are in {out / 'report.md'}"
        )
    return out


def _given_train_flags(argv: list[str]) -> argparse.Namespace:
    """The options set in ``--train-args`` (only their names matter here)."""
    p = argparse.ArgumentParser(add_help=False)
    add_options(p)
    args, _ = p.parse_known_args(argv)
    return args


def _tune(cells: list[Cell], cfg: Any, opts: BenchOptions, train_argv: list[str]) -> list[Tuning]:
    """Run the tuning trials of every group of ``cells``; print them as they finish."""
    groups: dict[tuple[str, str, Options], list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.group, []).append(c)
    runs_dir, logs = opts.out_dir / "tune" / "runs", opts.out_dir / "tune" / "logs"

    def run_trial(cell: Cell, setting: Options) -> tuple[str, str, float | None]:
        trial = Cell(cell.strategy, cell.workers, cell.model, cell.options + setting)
        argv = train_argv + option_argv(trial.options)
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
    acc = row.get("test_acc")
    sps = row.get("samples_per_s")
    return (
        f"ok in {row['wall_s']:.1f} s (test_acc {acc:.4f}, {sps:.0f} samples/s)"
        if acc is not None and sps is not None
        else f"ok in {row['wall_s']:.1f} s"
    )
