"""The ``jimu`` command: ``train``, ``probe``, ``report``, ``bench``. User errors print one line and exit 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

from deepjimu.config import ConfigErrors, RunConfig, coerce, load_config, option_fields
from deepjimu.errors import JimuError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        raise JimuError(f"{message} (see: {self.prog} --help)")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML file with any of these options")
    defaults = RunConfig().to_dict()
    for f in option_fields():
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if f.metadata.get("choices"):
            help_text += f" ({'|'.join(f.metadata['choices'])})"
        if str(f.type).startswith("bool"):
            p.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=f"{help_text} (default: {f.default})",
            )
        else:
            p.add_argument(
                flag,
                dest=f.name,
                default=argparse.SUPPRESS,
                metavar=f.name.upper(),
                help=f"{help_text} (default: {defaults[f.name]})",
            )


def build_parser() -> argparse.ArgumentParser:
    """The ``jimu`` argument parser (subcommands train, probe, report, bench)."""
    parser = _Parser(
        prog="jimu", description="Train one network with every way of splitting it over workers."
    )
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, required=True)
    train = sub.add_parser("train", help="train a model with one strategy")
    _add_run_options(train)
    probe = sub.add_parser(
        "probe",
        help="time the link and this device for ddp; predict each --compress option's step",
    )
    _add_run_options(probe)
    report = sub.add_parser("report", help="print a run's table and write its loss/accuracy plots")
    report.add_argument("run_dir", help="a run folder, e.g. runs/admm-digits-...")
    report.add_argument("--no-plots", action="store_true", help="only print the table")
    bench = sub.add_parser("bench", help="run strategies x worker counts side by side")
    from deepjimu.bench import add_bench_arguments

    add_bench_arguments(bench)
    return parser


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of ``jimu train`` flags (defaults < --config file < flags; --resume loads the run's)."""
    given = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    problems, flags = [], {}
    for name, value in given.items():
        try:
            flags[name] = coerce(name, value, "flag")
        except JimuError as e:
            problems.append(str(e))
    if problems:
        raise ConfigErrors(problems)
    if flags.get("resume"):
        saved = Path(flags["resume"]) / "config.json"
        if not saved.exists():
            raise JimuError(f"--resume {flags['resume']}: not a run folder (no {saved})")
        try:
            base = json.loads(saved.read_text())
        except ValueError as e:
            raise JimuError(f"--resume: {saved} is damaged ({e})") from None
        base.update(load_config({}, args.config).to_dict() if args.config else {})
        base.update(flags)
        base["name"], base["runs_dir"] = (
            Path(flags["resume"]).name,
            str(Path(flags["resume"]).parent),
        )
        return RunConfig.from_dict(base)
    return load_config(flags, args.config)


def main(argv: list[str] | None = None) -> int:
    """Run ``jimu``; returns the exit code (0 ok, 2 user error)."""
    try:
        args = build_parser().parse_args(argv)
        if args.command == "train":
            from deepjimu.launch import train

            summary = train(config_from_args(args))
            if summary is not None:
                _print_summary(summary)
            return 0
        if args.command == "probe":
            from deepjimu.launch import probe

            result = probe(config_from_args(args))
            if result is not None:
                print(result["text"])
            return 0
        if args.command == "report":
            from deepjimu.report import report

            report(Path(args.run_dir), plots=not args.no_plots)
            return 0
        from deepjimu.bench import bench_from_args

        bench_from_args(args)
        return 0
    except JimuError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def entry() -> NoReturn:
    """The ``jimu`` executable: :func:`main`, then exit with its code.

    A process that torchrun started leaves with ``os._exit`` once its output is flushed, as
    the workers of ``jimu train``'s own launcher (multiprocessing) always do. Gloo's worker
    threads release finished collectives, which hold Python tensors, some time after the
    caller has seen them complete; when that falls into interpreter shutdown the thread
    cannot take the GIL and the process aborts (seen here: about 1 run in 8 of
    ``torchrun --nproc-per-node 2 -m deepjimu train --strategy ddp`` ended in SIGABRT after
    a complete run; pytorch/pytorch#179291 describes the same crash). Skipping the
    shutdown is safe here: every file was closed or renamed into place before.
    """
    try:
        code = main()
    except SystemExit:  # --help
        raise
    except BaseException:  # not a user error: keep the traceback, exit 1
        traceback.print_exc()
        code = 1
    from deepjimu.launch import under_torchrun  # after main: torch is loaded by then anyway

    if under_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _print_summary(s: dict[str, Any]) -> None:
    acc = s.get("test_acc")
    print(
        f"{s['strategy']} x{s['workers']} on {s['dataset']} ({s['model']}): "
        f"test_acc {acc:.4f}, train_acc {s.get('train_acc') or 0:.4f}, "
        f"{s['epochs']} epochs in {s['time_s']:.1f} s"
    )
