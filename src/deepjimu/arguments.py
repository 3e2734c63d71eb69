"""The ``jimu`` command's arguments: a parser per subcommand (train, probe, report, bench, sbatch, plan).

Light: no torch import. The CLI builds its parser before torch loads, since the thread plan
of a launcher's worker must be in the environment first (:mod:`deepjimu.cli`).
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from deepjimu.bench.flags import BENCH_FLAGS, MATRIX_DEFAULTS
from deepjimu.errors import JimuError
from deepjimu.flags import add_options

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        raise JimuError(f"{message} (see: {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The ``jimu`` argument parser (subcommands train, probe, report, bench, sbatch, plan)."""
    parser = _Parser(
        prog="jimu", description="Train one network with every way of splitting it over workers."
    )
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, required=True)
    train = sub.add_parser("train", help="train a model with one strategy")
    train.add_argument("--config", metavar="FILE", help="TOML file with any of these options")
    add_options(train)
    probe = sub.add_parser(
        "probe",
        help="time the link and this device for ddp; predict each --compress option's step",
    )
    probe.add_argument("--config", metavar="FILE", help="TOML file with any of these options")
    add_options(probe)
    report = sub.add_parser("report", help="print a run's table and write its loss/accuracy plots")
    report.add_argument("run_dir", help="a run folder, e.g. runs/admm-digits-...")
    report.add_argument("--no-plots", action="store_true", help="only print the table")
    report.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="folder for loss.png and accuracy.png (default: the run folder)",
    )
    report.add_argument(
        "--target-acc",
        type=float,
        default=0.9,
        help="print the training time to this test accuracy, a fraction (default: 0.9)",
    )
    report.add_argument(
        "--target-loss",
        type=float,
        default=None,
        help="print the training time to this validation loss instead (a language model's "
        "figure, e.g. 1.9)",
    )
    bench = sub.add_parser("bench", help="run strategies x worker counts side by side")
    add_bench_arguments(bench)
    sbatch = sub.add_parser(
        "sbatch",
        help="write a Slurm batch script that runs srun jimu train on every task; --submit it",
    )
    add_sbatch_arguments(sbatch)
    plan = sub.add_parser(
        "plan", help="predict every strategy x workers on a cluster, ranked; --check runs them"
    )
    add_plan_arguments(plan)
    return parser


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
        help=f"comma list (default: {MATRIX_DEFAULTS['strategies']})",
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
        help="test accuracy for time-to-target, a fraction (default, except on text data: "
        "95%% of the best final test accuracy among the configurations, rounded down to a "
        "whole percent)",
    )
    p.add_argument(
        "--target-loss",
        type=float,
        default=None,
        help="validation loss for time-to-target instead, e.g. 1.9 (default on text data: the "
        "best final validation loss among the configurations over 95%%, rounded up to two "
        "decimals)",
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


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``jimu plan`` options to ``p``."""
    p.add_argument(
        "--strategies", default=None, help=f"comma list (default: {MATRIX_DEFAULTS['strategies']})"
    )
    p.add_argument("--workers", default=None, help="comma list of worker counts (default: 1,2,3)")
    p.add_argument("--models", default=None, help="comma list of model specs (default: mlp:256x3)")
    p.add_argument("--dataset", default="digits", help="dataset of every run (default: digits)")
    p.add_argument("--data-dir", default="data", help="folder with dataset files (default: data)")
    p.add_argument(
        "--epochs", type=int, default=None, help="epochs of every run (default: each strategy's)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every run (default: 0)")
    p.add_argument(
        "--cluster",
        default="probe",
        help="probe (measure this machine), a probe.json of jimu probe (its link; the model's "
        "work measured here) or a cluster TOML file (see examples/clusters)",
    )
    p.add_argument("--name", default=None, help="plan folder name (default: plan-YYYYmmdd-HHMMSS)")
    p.add_argument(
        "--plans-dir", default="plans", help="folder that holds plan folders (default: plans)"
    )
    p.add_argument(
        "--out", default=None, help="the plan folder itself, instead of --plans-dir/--name"
    )
    p.add_argument(
        "--check",
        nargs="?",
        type=int,
        const=0,
        default=None,
        metavar="N",
        help="run the N best predicted configurations for real (all without N; with N also "
        "the best one-worker configuration ranked below them) and print predicted against "
        "measured",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="R",
        help="with --check, run each configuration R times, in R rounds over all of them, and "
        "compare with the median (default: 1); the spread of a configuration's runs is what "
        "the machine itself varies",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per checked run (default: 300)"
    )
    add_options(
        p,
        exclude=BENCH_FLAGS,
        note="any jimu train option, for every configuration; a comma list is a matrix dimension",
    )


def add_sbatch_arguments(parser: argparse.ArgumentParser) -> None:
    """``jimu sbatch``'s own flags, then every ``jimu train`` option."""
    parser.add_argument("--nodes", type=int, default=1, help="machines (default: 1)")
    parser.add_argument(
        "--tasks-per-node",
        type=int,
        default=None,
        help="workers on each machine (default: --workers / --nodes, else 1)",
    )
    parser.add_argument("--time", default=None, help="time limit, as sbatch's --time (HH:MM:SS)")
    parser.add_argument("--partition", default=None, help="Slurm partition (default: Slurm's)")
    parser.add_argument(
        "--requeue",
        action="store_true",
        help="let Slurm requeue the job; it then goes on from its last checkpoint",
    )
    parser.add_argument(
        "--script",
        metavar="FILE",
        default=None,
        help="where to write the batch script (default: <runs-dir>/<name>.sbatch)",
    )
    parser.add_argument("--submit", action="store_true", help="submit it with sbatch")
    parser.add_argument("--config", metavar="FILE", help="TOML file with any jimu train option")
    add_options(parser, note="the run each task joins")
