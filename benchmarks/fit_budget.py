"""A model one worker cannot hold, trained under a memory budget per worker by every split.

Runs ``jimu bench`` over every strategy at 1 and 2 workers (more with ``--workers``) with
``--memory-limit B``: the configurations that cannot fit end as "does not fit" (refused
before they start, or stopped by their memory cgroup), the others train. Prints one table:
strategy, workers, fits, the predicted and the measured peak of what the budget counts
(the worker's memory group, ``budget_peak_mb``) and of the whole process (RSS), time per
epoch, bytes per sample and test accuracy. Needs root and a memory cgroup controller (the
budget is enforced by the kernel)::

    python benchmarks/fit_budget.py                       # mlp:6144x4 on digits, 1.5G
    python benchmarks/fit_budget.py --model mlp:4096x4 --limit 700M --workers 1,2,3
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.measure.blocks import layers_of
from deepjimu.models import build_model
from deepjimu.strategies.registry import rank_peaks, strategy_names
from deepjimu.validation import validate


def predicted_mb(strategy: str, workers: int, model: str, dataset: str) -> float:
    """The largest worker's predicted budget figure (its training state and runtime), MB."""
    cfg = validate(RunConfig(strategy=strategy, workers=workers, model=model, dataset=dataset))
    data = load_dataset(dataset, DataOptions.from_config(cfg))
    with torch.device("meta"):
        net = build_model(model, data.feature_shape, data.num_classes)
    layers = layers_of(net, data.train_x[:1])
    peaks = rank_peaks(cfg, layers, len(data.train_x), 0, cuda=False, whole=False)
    return max(peaks) / 2**20


def _num(row: dict[str, str], key: str, fmt: str) -> str:
    return format(float(row[key]), fmt) if row.get(key) else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp:6144x4")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--limit", default="1.5G")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--strategies", default=",".join(strategy_names()))
    ap.add_argument("--out", default=None, help="bench folder (default: a temporary one)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="fit-budget-"))
    cmd = [
        sys.executable, "-m", "deepjimu", "bench", "--bench-dir", str(out.parent),
        "--name", out.name, "--strategies", args.strategies, "--workers", args.workers,
        "--models", args.model, "--dataset", args.dataset, "--epochs", str(args.epochs),
        "--memory-limit", args.limit, "--timeout", "900",
    ]  # fmt: skip
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=False)
    rows = list(csv.DictReader((out / "results.csv").open()))
    head = (
        f"{'strategy':<15}{'workers':>8}  {'fits':<5}{'predicted MB':>13}{'budget peak':>12}"
        f"{'RSS peak':>10}{'s/epoch':>9}{'B/sample':>10}{'test acc':>9}"
    )
    print(f"\n{args.model} on {args.dataset}, --memory-limit {args.limit} per worker\n{head}")
    for r in rows:
        if r["status"] == "skipped":
            continue
        pred = predicted_mb(r["strategy"], int(r["workers"]), args.model, args.dataset)
        fits = (
            "yes" if r["status"] == "ok" else "no" if r["status"] == "does-not-fit" else r["status"]
        )
        epochs = float(r["epochs"] or 0) or None
        per_epoch = float(r["train_s"]) / epochs if epochs and r["train_s"] else None

        print(
            f"{r['strategy']:<15}{r['workers']:>8}  {fits:<5}{pred:>13.0f}"
            f"{_num(r, 'budget_peak_mb', '.0f'):>12}{_num(r, 'peak_mem_mb', '.0f'):>10}"
            f"{(f'{per_epoch:.1f}' if per_epoch else '-'):>9}"
            f"{_num(r, 'bytes_per_sample', '.0f'):>10}{_num(r, 'test_acc', '.3f'):>9}"
        )
        if r["status"] != "ok":
            print(f"{'':<25}{r['error']}")
    print(f"\nbench folder: {out}")


if __name__ == "__main__":
    main()
