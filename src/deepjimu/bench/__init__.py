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
import dataclasses
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepjimu.atomic import atomic_write_text
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
    train_options,
)
from deepjimu.bench.plots import write_plots
from deepjimu.bench.results import (
    COLUMNS,
    Target,
    add_speedups,
    add_time_to_target,
    choose_target,
    options_text,
    read_csv,
    write_csv,
)
from deepjimu.bench.runner import measure, run_cell, train_command
from deepjimu.bench.tune import Trial, Tuning, tune_group, tuned_keys
from deepjimu.config import ConfigErrors, RunConfig, add_options, field_kind, option_fields
from deepjimu.errors import Interrupted, JimuError
from deepjimu.report import read_summary
from deepjimu.record.folder import lock_run_dir

__all__ = [
    "COLUMNS",
    "BenchOptions",
    "add_bench_arguments",
    "bench_command",
    "bench_from_args",
    "run_bench",
    "train_flags",
]

DEFAULT_STRATEGIES = "local,ddp,model-parallel,pipeline,admm"
RECORD = "bench.json"
"""The bench's options and tuning choices, in its folder: what ``--resume`` goes on with."""

# the bench's own flags; None in the namespace means "not given" (so --resume can tell)
_DEFAULTS: dict[str, Any] = {
    "bench_dir": "bench",
    "strategies": DEFAULT_STRATEGIES,
    "workers": "1,2,3",
    "models": "mlp:256x3",
    "dataset": "digits",
    "data_dir": "data",
    "seed": 0,
    "timeout": 300.0,
    "train_args": "",
    "tune": False,
    "tune_trials": 5,
}


@dataclass
class BenchOptions:
    """What one bench runs. ``epochs`` None: each strategy's default epochs; ``target_acc``
    None: chosen from the runs (:func:`deepjimu.bench.results.choose_target`)."""

    name: str
    bench_dir: Path = Path("bench")
    strategies: tuple[str, ...] = tuple(DEFAULT_STRATEGIES.split(","))
    workers: tuple[int, ...] = (1, 2, 3)
    models: tuple[str, ...] = ("mlp:256x3",)
    dataset: str = "digits"
    data_dir: str = "data"
    epochs: int | None = None
    target_acc: float | None = None
    seed: int = 0
    timeout: float = 300.0
    train_args: str = ""
    flags: dict[str, str] = field(default_factory=dict)
    tune: int = 0

    @property
    def out_dir(self) -> Path:
        """``<bench_dir>/<name>``."""
        return self.bench_dir / self.name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (for :data:`RECORD`)."""
        return {**dataclasses.asdict(self), "bench_dir": str(self.bench_dir)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchOptions:
        """The options :meth:`to_dict` wrote."""
        return cls(
            **{
                **d,
                "bench_dir": Path(d["bench_dir"]),
                "strategies": tuple(d["strategies"]),
                "workers": tuple(d["workers"]),
                "models": tuple(d["models"]),
            }
        )


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``jimu bench`` options to ``p``."""
    _add_folder_arguments(p)
    _add_matrix_arguments(p)
    _add_tune_arguments(p)
    add_options(
        p,
        exclude=BENCH_FLAGS,
        note="any jimu train option, for every run; a comma list (--lr 1e-3,3e-3) is a matrix "
        "dimension",
    )


def _add_folder_arguments(p: argparse.ArgumentParser) -> None:
    """The bench folder's options: its name, where it goes, and --resume."""
    p.add_argument(
        "--name", default=None, help="bench folder name (default: bench-YYYYmmdd-HHMMSS)"
    )
    p.add_argument(
        "--bench-dir", default=None, help="folder that holds bench folders (default: bench)"
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        default=None,
        help="go on with the bench in DIR (one that was stopped): run only the configurations "
        "without a result; other options, if given, must be the bench's own",
    )


def _add_matrix_arguments(p: argparse.ArgumentParser) -> None:
    """The matrix's dimensions and what every run of it shares (data, epochs, seed, limits)."""
    p.add_argument(
        "--strategies",
        default=None,
        help=f"comma list (default: {DEFAULT_STRATEGIES})",
    )
    p.add_argument("--workers", default=None, help="comma list of worker counts (default: 1,2,3)")
    p.add_argument("--models", default=None, help="comma list of model specs (default: mlp:256x3)")
    p.add_argument("--dataset", default=None, help="dataset of every run (default: digits)")
    p.add_argument("--data-dir", default=None, help="folder with dataset files (default: data)")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs of every run (default: each strategy's default)",
    )
    p.add_argument(
        "--target-acc",
        type=float,
        default=None,
        help="test accuracy for time-to-target, a fraction (default: 95%% of the best final "
        "test accuracy among the configurations, rounded down to a whole percent)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of every run (default: 0)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds before a run is stopped and counted as timed out (default: 300)",
    )
    p.add_argument(
        "--train-args",
        default=None,
        help='extra jimu train flags for every run, as one string, e.g. "--microbatches 8"',
    )


def _add_tune_arguments(p: argparse.ArgumentParser) -> None:
    """--tune and its number of trials."""
    p.add_argument(
        "--tune",
        action="store_true",
        default=None,
        help="first tune every strategy on the validation split with the same number of trials "
        "(gradient strategies: lr; admm: rho and nu), then run the matrix at the chosen settings",
    )
    p.add_argument(
        "--tune-trials", type=int, default=None, help="trials per strategy for --tune (default: 5)"
    )


def train_flags(args: argparse.Namespace) -> dict[str, str]:
    """The ``jimu train`` options given to the bench, as text (booleans ``true`` / ``false``)."""
    kinds = {f.name: field_kind(f) for f in option_fields() if f.name not in BENCH_FLAGS}
    return {
        k: (str(v).lower() if kinds[k] == "bool" else str(v))
        for k, v in vars(args).items()
        if k in kinds
    }


def _options(args: argparse.Namespace, base: BenchOptions | None = None) -> BenchOptions:
    """The bench that ``args`` describe; options not given come from ``base`` (a resumed
    bench's record), else the defaults.

    Raises:
        JimuError: a bad value.
    """
    keys = (*_DEFAULTS, "name", "epochs", "target_acc")
    given = {k: v for k in keys if (v := getattr(args, k, None)) is not None}
    if given.get("epochs", 1) < 1:
        raise JimuError(f"--epochs must be >= 1 (epochs: {given['epochs']})")
    if not 0 < given.get("target_acc", 1) <= 1:
        raise JimuError(
            f"--target-acc must be a fraction in (0, 1] (target-acc: {given['target_acc']})"
        )
    if given.get("timeout", 1) <= 0:
        raise JimuError(f"--timeout must be > 0 seconds (timeout: {given['timeout']})")
    if given.get("tune_trials", 1) < 1:
        raise JimuError(f"--tune-trials must be >= 1 (tune-trials: {given['tune_trials']})")
    if base is None:
        values = {**_DEFAULTS, **given}
        opts = BenchOptions(
            name=given.get("name") or f"bench-{datetime.datetime.now():%Y%m%d-%H%M%S}"
        )
        tune, trials = values["tune"], values["tune_trials"]
    else:
        values = given
        opts = dataclasses.replace(base, flags=dict(base.flags))
        tune = given.get("tune", bool(base.tune))
        trials = given.get("tune_trials", base.tune or _DEFAULTS["tune_trials"])
    for k, v in values.items():
        if k in ("strategies", "models"):
            setattr(opts, k, tuple(parse_list(v, k)))
        elif k == "workers":
            opts.workers = tuple(parse_workers(v))
        elif k == "bench_dir":
            opts.bench_dir = Path(v)
        elif k not in ("tune", "tune_trials"):
            setattr(opts, k, v)
    opts.tune = trials if tune else 0
    opts.flags.update(train_flags(args))
    return opts


def bench_from_args(args: argparse.Namespace) -> Path:
    """Run the bench that ``jimu bench`` flags describe (or go on with ``--resume DIR``);
    returns its folder.

    Raises:
        JimuError: a bad option, or with ``--resume`` an option that differs from the
            bench's record (before any run starts).
    """
    if args.resume:
        return run_bench(_resumed(args), resume=True)
    return run_bench(_options(args))


def _resumed(args: argparse.Namespace) -> BenchOptions:
    """The options of the bench in ``--resume DIR``, checked against the ones given now.

    Raises:
        JimuError: DIR holds no bench record; ConfigErrors: one line per option given that
            differs from the record (only ``--timeout`` and ``--target-acc`` may change).
    """
    out = Path(args.resume)
    path = out / RECORD
    if not path.exists():
        raise JimuError(
            f"--resume {out}: {path} does not exist (not a bench folder, or one from a "
            "deepjimu without --resume); start a new bench"
        )
    try:
        recorded = BenchOptions.from_dict(json.loads(path.read_text())["options"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise JimuError(f"--resume {out}: {path} cannot be read: {e}") from None
    if args.name is not None or args.bench_dir is not None:
        raise JimuError(f"--resume {out} names the bench folder; leave out --name and --bench-dir")
    recorded = dataclasses.replace(recorded, name=out.name, bench_dir=out.parent)
    asked = _options(args, recorded)
    problems = []
    for f in dataclasses.fields(BenchOptions):
        if f.name in ("timeout", "target_acc", "flags"):  # neither changes a configuration
            continue
        was, now = getattr(recorded, f.name), getattr(asked, f.name)
        if was != now:
            flag = "--" + f.name.replace("_", "-")
            problems.append(
                f"--resume {out}: {flag} {_text(now)} differs from the bench's {_text(was)} "
                f"({path}); a resumed bench runs the matrix it recorded"
            )
    for k, v in asked.flags.items():
        if recorded.flags.get(k) != v:
            problems.append(
                f"--resume {out}: --{k.replace('_', '-')} {v} differs from the bench's "
                f"{recorded.flags.get(k, 'default')} ({path}); a resumed bench runs the matrix "
                "it recorded"
            )
    if problems:
        raise ConfigErrors(problems)
    return asked


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return "default" if value is None else str(value)


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
    argv += ["--seed", str(opts.seed), "--timeout", f"{opts.timeout:g}"]
    if opts.target_acc is not None:
        argv += ["--target-acc", f"{opts.target_acc:g}"]
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


def _write_record(opts: BenchOptions, tunings: list[Tuning] | None) -> None:
    record = {
        "options": opts.to_dict(),
        "tunings": None if tunings is None else [dataclasses.asdict(t) for t in tunings],
    }
    atomic_write_text(opts.out_dir / RECORD, json.dumps(record, indent=2) + "\n")


def _recorded_tunings(out: Path) -> list[Tuning] | None:
    """The tuning a resumed bench already did (None: it had not finished tuning)."""
    saved = json.loads((out / RECORD).read_text()).get("tunings")
    if saved is None:
        return None

    def options(pairs: list[list[str]]) -> Options:
        return tuple((k, v) for k, v in pairs)

    return [
        Tuning(
            t["strategy"],
            t["model"],
            options(t["options"]),
            t["workers"],
            [
                Trial(options(x["setting"]), x["status"], x["val_acc"], x["error"])
                for x in t["trials"]
            ],
        )
        for t in saved
    ]


def _read_back(cells: list[Cell], rows: list[dict[str, Any]], out: Path) -> int:
    """Fill the rows of the configurations that a stopped bench finished (ok in its
    ``results.csv``) from their run folders; the number read back. A run whose folder no
    longer reads is run again."""
    path = out / "results.csv"
    if not path.exists():
        return 0
    key = ("strategy", "workers", "model", "options")
    done = {tuple(r[k] or "" for k in key): r for r in read_csv(path) if r["status"] == "ok"}
    n = 0
    for cell, row in zip(cells, rows, strict=True):
        prev = done.get(tuple(str(row[k] or "") for k in key))
        if row["status"] != "pending" or prev is None:
            continue
        run_dir = out / "runs" / cell.name  # the folder as it is now, wherever the bench moved
        try:
            figures = measure(run_dir)
        except JimuError:
            continue
        row.update(
            status="ok",
            error="",
            wall_s=float(prev["wall_s"]) if prev["wall_s"] else None,
            run_dir=str(run_dir),
            log=str(out / "logs" / f"{cell.name}.stderr.log"),
            **figures,
        )
        n += 1
    return n


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
        tunings = _recorded_tunings(out) if resume else None
        if not resume:
            _write_record(opts, None)
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
            _write_record(opts, tunings)
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
    read_back = _read_back(cells, rows, opts.out_dir) if resume else 0
    todo = [(c, r) for c, r in zip(cells, rows, strict=True) if r["status"] == "pending"]
    skipped = sum(1 for c in cells if c.skip)
    print(
        f"bench {opts.name}: {len(todo)} runs"
        + (f" ({read_back} finished before, read back)" if resume else "")
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
    target = choose_target(rows, opts.target_acc)
    add_time_to_target(rows, target)
    write_csv(rows, out / "results.csv")
    title = f"{opts.dataset}, seed {opts.seed}, " + (
        f"{opts.epochs} epoch{'s' if opts.epochs != 1 else ''}" if opts.epochs else "default epochs"
    )
    plots = write_plots(rows, out, title, target)
    setup = _setup(opts, resume, train, target, t0, stopped)
    write_markdown(out / "report.md", rows, setup, plots, tunings)
    print(f"wrote {out / 'results.csv'} and {out / 'report.md'}")


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
    acc = row.get("test_acc")
    sps = row.get("samples_per_s")
    return (
        f"ok in {row['wall_s']:.1f} s (test_acc {acc:.4f}, {sps:.0f} samples/s)"
        if acc is not None and sps is not None
        else f"ok in {row['wall_s']:.1f} s"
    )
