"""K-FAC against SGD with momentum and Adam, and KAISA's traffic for each gradient-worker fraction.

One command prints both tables (Markdown):

    python benchmarks/kfac_bench.py                               # everything
    python benchmarks/kfac_bench.py --only accuracy --tasks digits-mlp,digits-lenet
    python benchmarks/kfac_bench.py --only comm --workers 2,3

**Accuracy table.** For each task and optimizer, every learning rate of the optimizer's grid
(``GRIDS``) trains ``local`` with seed 0; the rate whose *validation* accuracy reaches the
task's target in the fewest epochs wins (ties, or no rate reaching it: the highest
validation accuracy seen). The chosen rate then trains with seeds 0 .. S-1 (the seed also
draws the train/validation/test split) and the table gives, per seed, the first epoch whose
*test* accuracy reaches the target (and a lower one), their median (a seed that never gets
there within the task's epoch budget counts as infinitely late: "> budget"), and the
median training seconds to the target (the ``train_s`` clock: training steps only, no
evaluation). The test split never picks anything. A run stops early once its targets are
reached: it trains in chunks of
``--chunk`` epochs through ``--resume``, which continues exactly, so the figures equal those
of one long run. All runs use one thread (``--threads 1``) so that their seconds compare;
seconds are indicative only on a loaded machine. K-FAC keeps its defaults besides the rate
(damping 0.1, KL clip 0.001, factors every step, decompositions every 10 steps).

**Comm table.** ``ddp`` with 2 and 3 workers on digits, each valid fraction F of gradient
workers (1/workers: MEM-OPT ... 1: COMM-OPT) and SGD for reference: bytes sent per step by
all ranks, split into K-FAC's kinds (factor triangles, decompositions, preconditioned
gradients) and DDP's gradient all-reduce, and training seconds per step (slowest rank).
"""

from __future__ import annotations

import argparse
import itertools
import math
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train
from deepjimu.record.read import read_events
from deepjimu.units import format_bytes


@dataclass(frozen=True)
class Task:
    dataset: str
    model: str
    target: float  # tunes the rate (on validation) and stops the runs
    early: float  # a lower target, reported too
    max_epochs: int
    data_dir: str = "data"


TASKS = {
    "digits-mlp": Task("digits", "mlp:256x3", 0.97, 0.95, 40),
    "digits-lenet": Task("digits", "lenet", 0.97, 0.95, 40),
    # the 5,000 real MNIST digits of /work/shared/data (4,000 train, 28 x 28)
    "mnist-lenet": Task("mnist", "lenet", 0.96, 0.94, 20, "/work/shared/data"),
    # where that folder is absent: labels of a random teacher network, 196 features
    "synthetic-mlp": Task("synthetic", "mlp:256x3", 0.90, 0.85, 40),
}
GRIDS = {
    "sgd": (0.01, 0.03, 0.1, 0.3),
    "adam": (3e-4, 1e-3, 3e-3, 1e-2),
    "kfac": (0.03, 0.1, 0.3),
}


def _first(events: list[dict[str, Any]], key: str, target: float) -> int | None:
    return next((e["epoch"] for e in events if (e.get(key) or 0.0) >= target), None)


def _run(
    task: Task, optimizer: str, lr: float, seed: int, root: Path, chunk: int, need_val: bool
) -> list[dict[str, Any]]:
    """Train until the test (and with ``need_val`` the validation) target is reached; the events."""
    name = f"{task.dataset}-{task.model}-{optimizer}-{lr:g}-s{seed}".replace(":", "_")
    base = {
        "strategy": "local", "dataset": task.dataset, "model": task.model, "data_dir": task.data_dir,
        "optimizer": optimizer, "lr": lr, "seed": seed, "threads": 1, "quiet": True,
        "checkpoint_every": 0,
    }  # fmt: skip
    try:
        if (root / name / "summary.json").exists():  # kept by an earlier --runs-dir: go on from it
            epochs = read_events(root / name)[-1]["epoch"]
        else:
            shutil.rmtree(root / name, ignore_errors=True)  # a run cut off before its first end
            epochs = min(chunk, task.max_epochs)
            train(RunConfig(**base, epochs=epochs, runs_dir=str(root), name=name))
        while True:
            events = read_events(root / name)
            done = _first(events, "test_acc", task.target) is not None and (
                not need_val or _first(events, "val_acc", task.target) is not None
            )
            if done or epochs >= task.max_epochs:
                return events
            epochs = min(epochs + chunk, task.max_epochs)
            train(RunConfig(**base, epochs=epochs, resume=str(root / name)))
    except JimuError as e:  # a rate that diverges is a result of the grid, not a failure
        print(f"  {name}: {e}", file=sys.stderr)
        return []


def _train_seconds(events: list[dict[str, Any]], epoch: int | None) -> float | None:
    if epoch is None:
        return None
    return float(max(e["train_s"] for e in events if e["epoch"] <= epoch))  # the training clock


def _median(epochs: list[int | None]) -> float:
    """Median over seeds, a seed that never reached the target counting as infinitely late."""
    return statistics.median(math.inf if e is None else e for e in epochs)


def _cell(x: float, fmt: str, never: str) -> str:
    return never if math.isinf(x) else format(x, fmt)


def accuracy_table(tasks: list[str], seeds: int, chunk: int, root: Path) -> str:
    rows = [
        "| task | optimizer | lr grid | lr (val) | epochs to target, per seed | median | median s | epochs to lower target, per seed | median | s/epoch | best test |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in tasks:
        task = TASKS[key]
        medians: dict[str, float] = {}
        for optimizer, grid in GRIDS.items():
            tuning = {}
            for lr in grid:
                events = _run(task, optimizer, lr, 0, root, chunk, need_val=True)
                val_epoch = _first(events, "val_acc", task.target)
                best_val = max((e.get("val_acc") or 0.0 for e in events), default=0.0)
                tuning[lr] = ((val_epoch or math.inf), -best_val), events
                print(
                    f"  {key} {optimizer} lr {lr:g}: val target at {val_epoch}, best val {best_val:.3f}",
                    file=sys.stderr,
                )
            lr = min(tuning, key=lambda r: tuning[r][0])
            runs = [tuning[lr][1]] + [
                _run(task, optimizer, lr, s, root, chunk, False) for s in range(1, seeds)
            ]
            epochs = [_first(ev, "test_acc", task.target) for ev in runs]
            early = [_first(ev, "test_acc", task.early) for ev in runs]
            seconds = [
                math.inf if ep is None else _train_seconds(ev, ep)
                for ev, ep in zip(runs, epochs, strict=True)
            ]
            per_epoch = [
                (b["train_s"] - a["train_s"]) / (b["epoch"] - a["epoch"])
                for ev in runs
                for a, b in itertools.pairwise([{"train_s": 0.0, "epoch": 0}, *ev])
            ]
            medians[optimizer] = _median(epochs)
            best = max((e.get("test_acc") or 0.0 for ev in runs for e in ev), default=0.0)
            rows.append(
                f"| {key} ({task.model}, {task.target:.0%} / {task.early:.0%}) | {optimizer} "
                f"| {', '.join(f'{r:g}' for r in grid)} | {lr:g} "
                f"| {', '.join('-' if e is None else str(e) for e in epochs)} "
                f"| {_cell(medians[optimizer], 'g', f'> {task.max_epochs}')} | {_cell(statistics.median(seconds), '.1f', '-')} "
                f"| {', '.join('-' if e is None else str(e) for e in early)} | {_cell(_median(early), 'g', f'> {task.max_epochs}')} "
                f"| {statistics.median(per_epoch):.2f} | {best:.2%} |"
            )
        better = min(medians["sgd"], medians["adam"])
        if math.isfinite(better) and math.isfinite(medians["kfac"]):
            fewer = 1 - medians["kfac"] / better
            verdict = f"{abs(fewer):.0%} {'fewer' if fewer >= 0 else 'more'} epochs"
            rows.append(
                f"| {key} | kfac vs the better of sgd and adam | | | | **{verdict}** | | | | | |"
            )
    return "\n".join(rows)


def comm_table(workers: list[int], epochs: int, root: Path) -> str:
    rows = [
        "| workers | optimizer | F | grad workers / layer | bytes/step (all ranks) | factors | decompositions | precond. gradients | DDP all-reduce | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in workers:
        fractions = [k / w for k in range(1, w + 1) if w % k == 0]
        for optimizer, f in [("sgd", None)] + [("kfac", f) for f in fractions]:
            name = f"comm-{w}-{optimizer}-{f or 0:.3f}"
            cfg = RunConfig(
                strategy="ddp", workers=w, model="mlp:256x3", optimizer=optimizer,
                lr=0.1 if optimizer == "kfac" else 0.03, epochs=epochs, eval_every=epochs,
                threads=1, quiet=True, runs_dir=str(root), name=name,
                kfac_grad_workers=f or 1.0,
            )  # fmt: skip
            summary = train(cfg)
            assert summary is not None
            steps = summary["steps"]
            kinds = summary["bytes_sent_by_kind"]
            ddp = summary["bytes_sent"] - sum(kinds.values())
            seconds = summary["train_s"] / steps
            cells = [
                kinds.get(k, 0) / steps
                for k in ("kfac_factors", "kfac_decompositions", "kfac_gradients")
            ]
            rows.append(
                f"| {w} | {optimizer} | {'-' if f is None else f'{f:.3g}'} | {'-' if f is None else round(f * w)} "
                f"| {format_bytes(summary['bytes_sent'] / steps)} | "
                + " | ".join(format_bytes(c) if c else "0" for c in cells)
                + f" | {format_bytes(ddp / steps)} | {seconds * 1000:.1f} ms |"
            )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--only", choices=("accuracy", "comm"), help="print one table only")
    default_tasks = "digits-mlp,digits-lenet," + (
        "mnist-lenet"
        if (Path(TASKS["mnist-lenet"].data_dir) / "mnist").is_dir()
        else "synthetic-mlp"
    )
    p.add_argument("--tasks", default=default_tasks, help=f"comma-separated, of {', '.join(TASKS)}")
    p.add_argument(
        "--seeds", type=int, default=3, help="seeds of the chosen rate (median over them)"
    )
    p.add_argument("--chunk", type=int, default=5, help="epochs between early-stopping checks")
    p.add_argument("--workers", default="2,3", help="worker counts of the comm table")
    p.add_argument("--comm-epochs", type=int, default=2, help="epochs of each comm-table run")
    p.add_argument(
        "--runs-dir",
        help="keep the run folders here (default: a temporary folder); a re-run goes on from them",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.runs_dir or tmp)
        if args.only in (None, "accuracy"):
            tasks = [t for t in args.tasks.split(",") if t]
            unknown = [t for t in tasks if t not in TASKS]
            if unknown:
                p.error(f"unknown task(s) {unknown} (known: {', '.join(TASKS)})")
            print(accuracy_table(tasks, args.seeds, args.chunk, root), flush=True)
        if args.only in (None, "comm"):
            print()
            print(comm_table([int(w) for w in args.workers.split(",")], args.comm_epochs, root))


if __name__ == "__main__":
    main()
