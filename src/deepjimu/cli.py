"""The ``jimu`` command: ``train``, ``probe``, ``report``, ``bench``, ``sbatch``, ``plan``. User errors print one line and exit 2."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

from deepjimu.arguments import build_parser
from deepjimu.choices import OmpWait
from deepjimu.config import RunConfig, flag_values, read_toml
from deepjimu.errors import Interrupted, JimuError, OutOfMemory, signals_interrupt
from deepjimu.launchers import Placement, placement
from deepjimu.leave import leave
from deepjimu.plan.measuring import measuring_threads
from deepjimu.record.folder import saved_config
from deepjimu.threads import ThreadPlan, plan_threads, scoped_env, set_env

__all__ = ["main"]


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of ``jimu train`` flags (defaults < --config file < flags; --resume loads the run's).

    Its ``given`` names the options of the file and the flags (not the resumed run's saved
    ones): only those are refused where they do not apply.
    """
    flags = flag_values(args)
    from_file = read_toml(args.config) if args.config else {}
    given = {k: str(args.config) for k in from_file} | {k: "flag" for k in flags}
    if flags.get("resume"):
        # the run's own options; launch.train then refuses what its checkpoint contradicts
        base = dict(saved_config(Path(flags["resume"])))
        base.update(from_file)
        base.update(flags)
        base["name"], base["runs_dir"] = (
            Path(flags["resume"]).name,
            str(Path(flags["resume"]).parent),
        )
        return RunConfig.from_dict({**base, "given": given})
    return RunConfig(**{**from_file, **flags}, given=given)


def main(argv: list[str] | None = None) -> int:
    """Run ``jimu``; returns the exit code (0 ok, 2 user error, 3 out of memory, 130 / 143
    stopped by SIGINT / SIGTERM)."""
    place = None
    try:
        place = placement()  # torchrun, srun or mpirun started us: join their group
        # a worker of torchrun gets its agent's SIGTERM right after Ctrl-C, a task of srun may
        # get scancel's from slurmd and srun: only the first counts
        with signals_interrupt(once=place.joined):
            return _command(build_parser().parse_args(argv), place)
    except JimuError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return e.exit_code if isinstance(e, OutOfMemory) else 2
    except Interrupted as e:
        # the launcher signalled every worker: rank 0 alone says what is kept
        if place is None or place.rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def _command(args: argparse.Namespace, place: Placement) -> int:
    """Run the parsed command; its exit code."""
    if args.command == "train":
        cfg = config_from_args(args)
        plan = _joined_thread_plan(cfg, place)
        from deepjimu.launch import train  # loads torch, and with it OpenMP

        summary = train(cfg, plan)
        if summary is not None:
            _print_summary(summary)
        return 0
    if args.command == "probe":
        cfg = config_from_args(args)
        plan = _joined_thread_plan(cfg, place)
        from deepjimu.launch import probe

        result = probe(cfg, plan)
        if result is not None:
            print(result["text"])
        return 0
    if args.command == "report":
        from deepjimu.record.read import check_targets
        from deepjimu.report import report

        check_targets(args.target_acc, args.target_loss)
        report(
            Path(args.run_dir),
            plots=not args.no_plots,
            target_acc=args.target_acc,
            out_dir=Path(args.out) if args.out else None,
            target_loss=args.target_loss,
        )
        return 0
    if args.command == "sbatch":
        from deepjimu.sbatch import sbatch_from_args

        sbatch_from_args(args, config_from_args(args))
        return 0
    if args.command == "plan":
        _plan(args)
        return 0
    from deepjimu.bench.run import bench_from_args

    bench_from_args(args)
    return 0


def _plan(args: argparse.Namespace) -> None:
    """``jimu plan``, its own measurements under a one-worker run's OpenMP wait policy.

    The plan times the model's work in this process, and a one-worker configuration's
    figures come from there alone: they must be taken as its run would take them. A run on
    a busy machine gets a passive OpenMP wait (:mod:`deepjimu.threads`); measured with
    OpenMP's own spinning wait instead, one was predicted at 192-594 samples/s while its
    run did 28,202 (issue 48). OpenMP reads the policy once, when torch loads it, so it is
    set for the import alone: the probe's workers and the checked runs start with the
    user's environment and make their own thread plans. One process has one policy: the
    figures of several workers are measured under one worker's too (the probe's ranks,
    which step under their own plan, measure what sharing the cores adds).
    """
    threads = measuring_threads(args)
    wait = {"OMP_WAIT_POLICY": threads.env()["OMP_WAIT_POLICY"]} if threads else {}
    with scoped_env(wait):
        from deepjimu.plan.command import plan_from_args  # loads torch, and with it OpenMP

    plan_from_args(args, threads)


def entry() -> NoReturn:
    """The ``jimu`` executable: :func:`main`, then exit with its code.

    A process that ran a process group (a worker under torchrun, a one-worker ddp run)
    leaves without Python's shutdown, once its output is flushed: see
    :mod:`deepjimu.leave`.
    """
    try:
        code = main()
    except SystemExit:  # --help
        raise
    except BaseException:  # not a user error: keep the traceback, exit 1
        traceback.print_exc()
        code = 1
    leave(code)


def _joined_thread_plan(cfg: RunConfig, place: Placement) -> ThreadPlan | None:
    """Under a launcher (torchrun, srun, mpirun): this process's thread plan, put into its
    environment before torch loads.

    OpenMP reads OMP_WAIT_POLICY once, when torch loads it; the launcher starts this
    process with the user's environment, so the plan must be applied here, before any torch
    import. The workers on this machine share its cores.
    """
    if not place.joined or cfg.threads < 0 or cfg.omp_wait not in OmpWait.spellings():
        return None  # jimu starts the workers, or a bad value that validation will name
    plan = plan_threads(place.local_world, cfg.threads, cfg.omp_wait)
    set_env(plan.env())
    return plan


def _print_summary(s: dict[str, Any]) -> None:
    acc = s.get("test_acc")
    r = s.get("replicas", 1)
    mesh = f" ({r} replicas x {s['workers'] // r})" if r > 1 else ""
    # a language model's figure first: its validation loss (nats a token)
    val_loss = f"val_loss {s['val_loss']:.4f}, " if s.get("val_loss") is not None else ""
    length = f"{s['epochs']} epoch{'s' if s['epochs'] != 1 else ''}"
    print(
        f"{s['strategy']} x{s['workers']}{mesh} on {s['dataset']} ({s['model']}): "
        f"{val_loss}test_acc {acc:.4f}, train_acc {s.get('train_acc') or 0:.4f}, "
        f"{length} in {s['fit_s']:.1f} s "
        f"(training {s['train_s']:.1f} s, "
        f"evaluation {s['eval_s']:.1f} s; {s['time_s']:.1f} s since the start)"
    )
