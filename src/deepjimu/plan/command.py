"""``jimu plan``: predict every configuration of a matrix on a cluster, rank them, and check them for real.

The matrix is the bench's (``--strategies`` x ``--workers`` x ``--models`` x any comma
list of a ``jimu train`` option), validated as ``jimu bench`` validates it. The cluster
is either this machine (``--cluster probe``: the link is timed by ``jimu probe``'s
collectives over real workers, the model's work measured in this process at each
worker count's threads, under a one-worker run's OpenMP wait policy) or a TOML file
describing one that is not here (FLOPs scaled by its devices' peaks). ``--check [N]`` then
runs the N best predicted configurations (all without N; with N, also the best-ranked one
of one worker below them) as ``jimu bench`` would run them and prints predicted against
measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
from pathlib import Path
from typing import Any

from deepjimu.atomic import atomic_write_text
from deepjimu.bench.flags import MATRIX_DEFAULTS, train_flags
from deepjimu.bench.matrix import (
    Cell,
    coerce,
    parse_list,
    parse_workers,
    plan,
    split_variants,
    train_config,
    train_options,
)
from deepjimu.budget import memory_limit_bytes
from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster
from deepjimu.cost.cluster_file import cluster_to_dict
from deepjimu.cost.predict.replicated import sync_choice, sync_entries
from deepjimu.cost.profile import Layer
from deepjimu.cost.sync import TRIAL_MARGIN, format_plan, plan_to_dict
from deepjimu.errors import Interrupted, JimuError
from deepjimu.options import SyncGroup
from deepjimu.plan.check import check, label, signum, stopped
from deepjimu.plan.measuring import on_paper
from deepjimu.plan.setup import (
    cluster_and_compute,
    measure_again,
    measured_spread,
    noisy_measurements,
)
from deepjimu.strategies.registry import entry, predict, rank_peaks
from deepjimu.threads import ThreadPlan
from deepjimu.units import format_bytes
from deepjimu.validation import validate

__all__ = ["plan_from_args"]


@dataclasses.dataclass(frozen=True)
class _Config:
    """One configuration of the plan: its cell, validated config and ``jimu train`` flags."""

    cell: Cell
    cfg: RunConfig
    argv: list[str]


def _configs(args: argparse.Namespace) -> tuple[list[_Config], list[Cell]]:
    """The matrix of ``args``: the configurations to predict and the skipped cells."""
    strategies = parse_list(args.strategies or MATRIX_DEFAULTS["strategies"], "strategies")
    workers = parse_workers(args.workers or MATRIX_DEFAULTS["workers"])
    models = parse_list(args.models or MATRIX_DEFAULTS["models"], "models")
    if args.epochs is not None and args.epochs < 1:
        raise JimuError(f"--epochs must be >= 1 (epochs: {args.epochs})")
    fixed, variants = split_variants(train_flags(args))
    base = {
        "dataset": args.dataset,
        "data_dir": args.data_dir,
        "seed": args.seed,
        "epochs": args.epochs,
    }
    cfg = train_config(fixed, base)
    cells = plan(cfg, strategies, workers, models, variants, fixed=[k for k, _ in fixed])
    out = []
    for cell in cells:
        if cell.skip:
            continue
        argv = cell.argv(fixed)
        own = train_config(train_options(argv), base)
        typed = {k: coerce(k, v, "flag") for k, v in cell.options}
        one = dataclasses.replace(
            own, strategy=cell.strategy, workers=cell.workers, model=cell.model, quiet=True, **typed
        )
        out.append(_Config(cell, validate(one), argv))
    return out, [c for c in cells if c.skip]


def plan_from_args(args: argparse.Namespace, threads: ThreadPlan | None = None) -> Path:
    """Run ``jimu plan``: predict, print the ranked table, write ``plan.json``; ``--check``
    runs the best ones. Returns the output folder.

    ``threads``: the thread plan of a one-worker run under which this process measures
    (:func:`~deepjimu.plan.measuring.measuring_threads`; its OpenMP wait policy is set
    before torch loads), printed in one line; None where nothing is measured here.

    Ctrl-C keeps what is done: ``plan.json`` is written once every configuration is
    predicted, before the check, and again with the checked runs that finished; folders of
    nothing (a probe or a run stopped before it wrote anything) are removed.

    Raises:
        JimuError: a bad option or cluster file, a configuration ``jimu train`` would refuse.
        Interrupted: Ctrl-C (or SIGTERM), in one line saying what was not done and what is kept.
    """
    if args.repeats < 1:
        raise JimuError(f"--repeats must be >= 1 (repeats: {args.repeats})")
    configs, skipped = _configs(args)
    # as jimu train's --runs-dir/--name and jimu bench's --bench-dir/--name; --out names it whole
    name = args.name or f"plan-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    out = Path(args.out or Path(args.plans_dir) / name)
    if (out / "plan.json").exists():
        raise JimuError(f"plan folder {out} already holds a plan.json; pick another --out")
    ours = not out.exists()  # a folder this plan makes, removed where it is left empty
    try:
        if threads is not None:
            print(f"measuring in this process as one worker: {threads.describe()}", flush=True)
        rows, noisy = _predict(configs, args.cluster, out)
        caveat = _caveat(args.cluster)
        print(_table(rows) + (f"\n{caveat}" if caveat else ""))
        for line in noisy:
            print(f"warning: {line}")
        for r in rows:
            if "_sync_table" in r:
                print(f"\n{label(r)}: sync plan\n{r['_sync_table']}")
        for cell in skipped:
            print(f"skipped {cell.label}: {cell.skip}")
        _write_plan(out, rows, caveat)
        if args.check is not None:
            try:
                check(rows, args, out)
            finally:  # the checked rows that finished, whatever stopped the others
                _write_plan(out, rows, caveat)
    except KeyboardInterrupt as e:
        _prune(out, ours)
        kept = f"kept {out / 'plan.json'}" if (out / "plan.json").exists() else "no plan written"
        # the line of the stage it stopped (predicting, the check) where it has one
        said = str(e) or str(stopped(e, ""))
        raise Interrupted(signum(e), f"{said}; {kept}") from None
    print(f"plan: {out / 'plan.json'}")
    return out


def _write_plan(out: Path, rows: list[dict[str, Any]], caveat: str | None) -> None:
    """``out/plan.json``: the cluster, the ranked rows as far as they are done, and a plan on
    paper's caveat (:func:`_caveat`)."""
    plan = {
        # the cluster of the most workers (with a probe, each count has its own fits)
        "cluster": max(rows, key=lambda r: r["workers"])["_cluster"] if rows else None,
        "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
    }
    if caveat:
        plan["caveat"] = caveat
    atomic_write_text(out / "plan.json", json.dumps(plan, indent=2))


def _caveat(cluster_arg: str) -> str | None:
    """For a plan on paper (a cluster file), the line under its table: where its figures
    come from and how far such figures were found off (docs/plan.md: checked on one H100
    against ``examples/clusters/h100-node.toml``); None for a measured cluster."""
    if not on_paper(cluster_arg):
        return None
    return (
        f"on paper: the model's FLOPs over the datasheet peaks of {cluster_arg} (times its "
        "efficiency), nothing measured; such a plan, checked on one H100, was 1.35-6x too "
        "fast (docs/plan.md): --check it on that cluster, or plan there with --cluster probe"
    )


def _prune(out: Path, ours: bool) -> None:
    """Remove the folders under ``out`` that hold nothing of use: none, or only a run's
    ``.lock`` (a probe or a run stopped before it wrote anything); ``out`` itself too where
    this plan made it (``ours``)."""
    for where, _, _ in os.walk(out, topdown=False):
        folder = Path(where)
        if folder == out and not ours:
            continue
        inside = list(folder.iterdir())
        if all(f.name == ".lock" and f.is_file() for f in inside):
            for f in inside:
                f.unlink()
            folder.rmdir()


def _predict(
    configs: list[_Config], cluster_arg: str, out: Path
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every configuration's row with its prediction (or why it has none), ranked, and a line
    for each measurement whose repeats disagreed past their tolerance.

    Raises:
        Interrupted: Ctrl-C (or SIGTERM), in one line saying how many were predicted.
    """
    rows: list[dict[str, Any]] = []
    made: dict[tuple[Any, ...], Any] = {}
    every = [x.cfg for x in configs]
    try:
        for c in configs:
            rows.append(_predict_one(c, cluster_arg, out, made, every))
        if not on_paper(cluster_arg):  # the figures measured here, in rounds: predicted again
            measure_again(made)
            rows = [_predict_one(c, cluster_arg, out, made, every) for c in configs]
    except KeyboardInterrupt as e:
        # not the probe's own line: its folder's lack of a checkpoint is no concern of a plan
        done = f"{len(rows)} of {len(configs)} configurations predicted"
        raise stopped(e, f" while predicting ({done})") from None
    # fastest first; configurations that do not fit after those that do, and those without
    # a prediction last
    rows.sort(
        key=lambda r: (
            "does_not_fit" in r,
            -r["predicted"]["samples_per_s"] if r.get("predicted") else math.inf,
        )
    )
    mark_ties(rows, measured_spread(made) / 2)
    return rows, noisy_measurements(made)


def mark_ties(rows: list[dict[str, Any]], band: float) -> None:
    """Mark (``tie``: the band) the ranked ``rows`` that fit and are predicted within
    ``band`` (a fraction) of the fastest, the fastest among them: the repeated timings they
    come from spread by twice that, so their order is not the plan's to say.

    Example:
        >>> rows = [{"predicted": {"samples_per_s": s}} for s in (100, 95, 80)]
        >>> mark_ties(rows, 0.1)
        >>> ["tie" in r for r in rows]
        [True, True, False]
    """
    ranked = [r for r in rows if r.get("predicted") and "does_not_fit" not in r]
    if not ranked or band <= 0:
        return
    best = ranked[0]["predicted"]["samples_per_s"]
    tied = [r for r in ranked if r["predicted"]["samples_per_s"] >= best * (1 - band)]
    if len(tied) > 1:
        for r in tied:
            r["tie"] = band


def _predict_one(
    c: _Config, cluster_arg: str, out: Path, made: dict[Any, Any], all_cfgs: list[RunConfig]
) -> dict[str, Any]:
    """The row of configuration ``c``: its prediction (or why it has none), whether it fits."""
    cluster, compute, layers, train_size = cluster_and_compute(
        c.cfg, cluster_arg, out, made, all_cfgs
    )
    row: dict[str, Any] = {
        "strategy": c.cell.strategy,
        "workers": c.cell.workers,
        "model": c.cell.model,
        "options": dict(c.cell.options),
        "_cell": c.cell,
        "_argv": c.argv,
        "_cluster": cluster_to_dict(cluster),
    }
    try:
        row["predicted"] = predict(c.cfg, layers, train_size, compute, cluster).to_dict()
    except ValueError as e:
        row["predicted"], row["not_predicted"] = None, str(e)
    short = _short_of_memory(c.cfg, layers, train_size, cluster)
    if short is not None:
        row["does_not_fit"] = {"needs_bytes": short[0], "has_bytes": short[1], "by": short[2]}
    # a strategy that takes the gradient sync's options, with a sync plan: its plan too
    planned = entry(c.cfg.strategy).takes(SyncGroup) and c.cfg.sync_plan != "allreduce"
    if planned and row["predicted"]:
        p = c.cell.workers
        entries = sync_entries(c.cfg, layers, compute, cluster, p)
        kept = sync_choice(c.cfg, layers, train_size, compute, cluster)[1]
        row["sync_plan"] = {**plan_to_dict(entries, c.cfg.sync_plan, p), "kept": kept}
        row["_sync_table"] = format_plan(entries, c.cfg.sync_plan)
        if kept == "DDP" and c.cfg.sync_plan == "auto":
            row["_sync_table"] += (
                f"\nnot predicted faster than torch's DDP by more than {TRIAL_MARGIN:.0%}: "
                "the row is DDP's, as the run's own trial would keep DDP"
            )
    return row


def _short_of_memory(
    cfg: RunConfig, layers: list[Layer], train_size: int, cluster: Cluster
) -> tuple[int, int, str] | None:
    """(needs, has, what) where ``cfg``'s largest rank is predicted past its memory: the
    cluster file's device memory (``memory_gb``), or ``--memory-limit`` (what it counts:
    the training state, :func:`~deepjimu.strategies.registry.rank_peaks`); None where it fits."""
    cuda = cluster.gpus
    state = max(rank_peaks(cfg, layers, train_size, 0, cuda, whole=False), default=0)
    limits = []
    if cuda and cluster.device.memory_bytes > 0:
        limits.append((cluster.device.memory_bytes, f"{cluster.device.name}'s memory"))
    budget = memory_limit_bytes(cfg.memory_limit)
    if budget is not None:
        limits.append((budget, "--memory-limit"))
    over = [(has, what) for has, what in limits if state > has]
    if not over:
        return None
    has, what = min(over)
    return state, has, what


def _table(rows: list[dict[str, Any]]) -> str:
    """The ranked predictions, fastest first."""
    width = max([len(label(r)) for r in rows] + [13])
    lines = [
        f"{'configuration':<{width}}{'samples/s':>12}{'step ms':>10}{'sent/sample':>13}{'peak MB':>10}"
    ]
    for r in rows:
        p = r.get("predicted")
        if p is None:
            lines.append(f"{label(r):<{width}}  not predicted: {r['not_predicted']}")
            continue
        short = r.get("does_not_fit")
        fits = (
            f"  does not fit (needs {format_bytes(short['needs_bytes'])}, has "
            f"{format_bytes(short['has_bytes'])}: {short['by']})"
            if short
            else ""
        )
        tie = "  = tie" if "tie" in r else ""
        lines.append(
            f"{label(r):<{width}}{p['samples_per_s']:>12.0f}{p['step_s'] * 1e3:>10.2f}"
            f"{format_bytes(p['bytes_per_sample']):>13}{p['peak_mem_mb']:>10.1f}{fits}{tie}"
        )
    band = next((r["tie"] for r in rows if "tie" in r), None)
    if band is not None:
        lines.append(
            f"= tie: predicted within {band:.0%} of the fastest, half the spread of the "
            "repeated timings they come from: their order is a tie, not a ranking"
        )
    return "\n".join(lines)
