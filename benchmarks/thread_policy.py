"""Training time of every strategy and worker count under each OpenMP wait policy, in one run.

For each (strategy, workers) it runs ``jimu train --omp-wait P`` for P in default (OpenMP's
own: spin briefly, then sleep), active and passive, rounds alternating the policies so that
background load hits all alike, and reports the median ``train_s`` (training time, evaluation
excluded) of each policy, the policy that ``--omp-wait auto`` picks (deepjimu.threads) and
its time over the fastest policy's. This is the measurement behind the rule in
``deepjimu/threads.py``.

Usage:
    python benchmarks/thread_policy.py [--strategies local,ddp,model-parallel,pipeline,admm]
        [--workers 1,2,3] [--epochs 30] [--rounds 3] [--dataset digits] [--model mlp:256x3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from deepjimu.threads import available_cores, plan_threads

__all__ = ["main"]

POLICIES = ("default", "active", "passive")


def train_s(
    args: argparse.Namespace, strategy: str, workers: int, policy: str, out: Path, round_: int
) -> float:
    """``train_s`` of one ``jimu train`` run with ``--omp-wait policy``."""
    name = f"{strategy}-w{workers}-{policy}-{round_}"
    cmd = [sys.executable, "-m", "deepjimu", "train", "--strategy", strategy]
    cmd += ["--workers", str(workers), "--omp-wait", policy, "--model", args.model]
    cmd += ["--dataset", args.dataset, "--data-dir", args.data_dir, "--epochs", str(args.epochs)]
    cmd += ["--downsample", str(args.downsample), "--quiet", "--runs-dir", str(out), "--name", name]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return float(json.loads((out / name / "summary.json").read_text())["train_s"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="local,ddp,model-parallel,pipeline,admm")
    p.add_argument("--workers", default="1,2,3")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="mlp:256x3")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--downsample", type=int, default=1)
    args = p.parse_args(argv)
    cores = available_cores()
    print(
        f"{cores} cores; {args.model} on {args.dataset}, {args.epochs} epochs, {args.rounds} rounds"
    )
    print(f"\n{'strategy':<15} {'workers':>7} " + " ".join(f"{x:>9}" for x in POLICIES)
          + "   auto picks   auto / fastest")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in args.strategies.split(","):
            for w in (int(x) for x in args.workers.split(",")):
                if (strategy == "local" and w > 1) or (strategy == "pipeline" and w < 2):
                    continue
                times: dict[str, list[float]] = {x: [] for x in POLICIES}
                for r in range(args.rounds):
                    for policy in POLICIES:
                        times[policy].append(train_s(args, strategy, w, policy, Path(tmp), r))
                med = {x: statistics.median(v) for x, v in times.items()}
                auto = plan_threads(w, cores=cores, environ={}).wait
                print(
                    f"{strategy:<15} {w:>7} " + " ".join(f"{med[x]:>8.2f}s" for x in POLICIES)
                    + f"   {auto:>10}   {med[auto] / min(med.values()):>13.2f}",
                    flush=True,
                )  # fmt: skip


if __name__ == "__main__":
    main()
