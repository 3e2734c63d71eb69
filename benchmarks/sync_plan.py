"""Every ``--sync-plan`` method, and auto, on a wide MLP and an embedding bag: step time and bytes per step, measured against predicted.

For each workload it runs ``jimu train --strategy ddp --workers W --sync-plan M`` for every
method M that applies (``sparse`` only where the model has a sparse embedding) and
``auto``, in rounds that alternate the methods so that background load hits all alike, and
prints per method the median step (``step_s``: the mean step past the first, from the
run's summary), the bytes one rank sent per step (the run's counted ``bytes_sent`` over
its ranks and steps) against the planner's prediction (the method's own
``sync_plan.json``; for ``allreduce``, which runs torch's DDP and saves no plan, the
first ``auto`` run's figure for all-reduce everywhere), the median of each run's error
against its own plan (auto probes and plans anew in every run), the predicted communication per step,
and auto's step over the best single method's.

The workloads (the issue's): ``mlp:4096x3`` on digits at 16 rows per rank (a wide layer at
a small batch: sufficient factors), ``embed:VOCAB:DIM`` on ``bow`` (an embedding's
sparse gradient: its touched rows), and ``embed-mlp``, the embedding with a head of two
4096-wide layers (``embed:100000:64:4096x2``), where no single method suits every tensor. Rows are split evenly (``--balance even``): ddp's
default weighs each rank's rows by speeds measured at the run's start, and the methods must
train on the same rows to deliver the same gradients.

Usage:
    nice -n 5 python benchmarks/sync_plan.py [--workers 2] [--rounds 2] [--epochs 1]
        [--only mlp|embed|embed-mlp]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["WORKLOADS", "figures", "main"]

WORKLOADS: dict[str, dict[str, Any]] = {
    "mlp": {
        "flags": ["--model", "mlp:4096x3", "--dataset", "digits", "--balance", "even"],
        "methods": ["allreduce", "ps", "sfb", "auto"],
    },
    "embed": {
        "flags": [
            "--model", "embed:100000:64", "--dataset", "bow", "--synthetic-features", "100000",
            "--synthetic-n", "20000", "--optimizer", "sgd", "--momentum", "0", "--lr", "2",
            "--balance", "even",
        ],
        "methods": ["allreduce", "ps", "sfb", "sparse", "auto"],
    },
    "embed-mlp": {
        "flags": [
            "--model", "embed:100000:64:4096x2", "--dataset", "bow",
            "--synthetic-features", "100000", "--synthetic-n", "4000", "--optimizer", "sgd",
            "--momentum", "0", "--lr", "2", "--balance", "even",
        ],
        "methods": ["allreduce", "ps", "sfb", "sparse", "auto"],
    },
}  # fmt: skip


def run(
    args: argparse.Namespace, workload: str, method: str, out: Path, round_: int
) -> dict[str, Any]:
    """One ``jimu train`` run: its step, bytes per step per rank, and its saved plan (or None)."""
    name = f"{workload}-{method}-{round_}"
    cmd = [sys.executable, "-m", "deepjimu", "train", "--strategy", "ddp"]
    cmd += ["--workers", str(args.workers), "--batch-size", str(16 * args.workers)]
    cmd += [*WORKLOADS[workload]["flags"], "--epochs", str(args.epochs), "--sync-plan", method]
    cmd += ["--quiet", "--runs-dir", str(out), "--name", name]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:  # the run's own line, not a CalledProcessError's traceback
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise SystemExit(f"{name} failed (exit {done.returncode}): {lines[-1]}")
    return figures(out / name, args.workers)


def figures(folder: Path, workers: int) -> dict[str, Any]:
    """A finished run's step, test accuracy, bytes one rank sent per step, and its saved
    sync plan (None for ``allreduce``, which runs torch's DDP)."""
    summary = json.loads((folder / "summary.json").read_text())
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    steps = events[-1]["step"]
    plan = folder / "sync_plan.json"
    return {
        "step_s": summary["step_s"],
        "test_acc": summary["test_acc"],
        "bytes": sum(e["bytes_sent"] for e in events) / workers / steps,
        "plan": json.loads(plan.read_text()) if plan.exists() else None,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--only", choices=sorted(WORKLOADS), default=None)
    args = p.parse_args(argv)
    workloads = [args.only] if args.only else list(WORKLOADS)
    with tempfile.TemporaryDirectory() as tmp:
        for workload in workloads:
            methods = WORKLOADS[workload]["methods"]
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
            for r in range(args.rounds):
                for m in methods:
                    runs[m].append(run(args, workload, m, Path(tmp), r))
            auto_plan = runs["auto"][0]["plan"]
            print(
                f"\n{workload}: {' '.join(WORKLOADS[workload]['flags'])}, {args.workers} workers, "
                f"16 rows per worker, {args.epochs} epoch(s), median of {args.rounds} runs"
            )
            print(
                f"{'method':<10}{'step ms':>9}{'sent/step':>12}{'predicted':>12}{'bytes err':>10}"
                f"{'pred. comm ms':>15}{'test acc':>10}  plan"
            )
            steps = {}
            for m in methods:
                rs = runs[m]
                step = statistics.median(x["step_s"] for x in rs)
                sent = statistics.median(x["bytes"] for x in rs)
                plan = rs[0]["plan"]
                # each run against its own plan (auto's may differ between probes)
                owns = [
                    {"bytes": x["plan"]["bytes"], "seconds": x["plan"]["seconds"]}
                    if m == "auto"
                    else (x["plan"] or auto_plan)["single_methods"][m]
                    for x in rs
                ]
                own = {k: statistics.median(o[k] for o in owns) for k in ("bytes", "seconds")}
                error = statistics.median(
                    x["bytes"] / o["bytes"] - 1 for x, o in zip(rs, owns, strict=True)
                )
                chosen = plan["methods"] if plan else {"allreduce (DDP)": 1}
                mix = ", ".join(f"{k} {v}" for k, v in chosen.items() if v)
                steps[m] = step
                print(
                    f"{m:<10}{step * 1e3:>9.1f}{sent / 1e6:>10.3f}MB{own['bytes'] / 1e6:>10.3f}MB"
                    f"{error:>+10.1%}{own['seconds'] * 1e3:>15.2f}"
                    f"{statistics.median(x['test_acc'] for x in rs):>10.3f}  {mix}"
                )
            best = min((s, m) for m, s in steps.items() if m != "auto")
            print(f"auto / best single method ({best[1]}): {steps['auto'] / best[0]:.3f}")
            for r, x in enumerate(runs["auto"]):  # each auto run probed and planned anew
                chosen = ", ".join(
                    f"{t['name']} {t['method']} ({t['seconds'] * 1e3:.2f} ms; "
                    + ", ".join(
                        f"{m} {o['seconds'] * 1e3:.2f}"
                        for m, o in t["options"].items()
                        if m != t["method"]
                    )
                    + ")"
                    for t in x["plan"]["tensors"]
                )
                print(f"auto run {r}: {chosen}")


if __name__ == "__main__":
    main()
