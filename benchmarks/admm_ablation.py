"""Ablation of admm's options: each alone and the default combination, against Adam, in one run.

For every model and data set it runs ``jimu train`` once per variant (each an ordinary run
folder) and prints test accuracy after ``--report`` iterations, the final train and test
accuracy, and the training time (evaluation excluded), next to ``local`` (Adam, its defaults)
on the same data. Variants are admm flag sets; ``base`` is the paper's pdADMM as deepjimu
solves it (exact subproblems, rho = nu = 1, no momentum, ridge or sweep, the model's own
initialisation); every other variant turns one option on; ``defaults`` is ``jimu train``'s.

Usage:
    python benchmarks/admm_ablation.py --dataset digits
    python benchmarks/admm_ablation.py --dataset mnist --data-dir ../shared/data --downsample 2 \\
        --models mlp:256x3,mlp:500x6,mlp:500x10
    python benchmarks/admm_ablation.py --minibatch 500 --epochs 10     # mini-batch variants
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["FULL_BATCH", "MINI_BATCH", "main"]

# base: the paper's pdADMM as deepjimu solves it, every option off
OFF = {
    "admm-momentum": "0",
    "admm-init": "forward",
    "rho-growth": "1",
    "admm-ridge": "0",
    "admm-sweeps": "0",
    "admm-readout": "iterate",
}


def _flags(**on: str) -> str:
    """The base flags with the options ``on`` (underscores for dashes) set instead."""
    values = OFF | {k.replace("_", "-"): v for k, v in on.items()}
    return " ".join(f"--{k} {v}" for k, v in values.items())


BASE = _flags()
FULL_BATCH = {
    "base": BASE,
    "momentum 0.7": _flags(admm_momentum="0.7"),
    "ridge 0.01": _flags(admm_ridge="0.01"),
    "sweep 1": _flags(admm_sweeps="1"),
    "scaled start": _flags(admm_init="scaled"),
    "rho growth 2": _flags(rho_growth="2"),
    "readout auto": _flags(admm_readout="auto"),
    "defaults": "",
}
MINI_BATCH = {
    "base (per-batch prox)": _flags(admm_memory="0"),
    "memory 0.8": _flags(admm_memory="0.8"),
    "restart (the other defaults)": "--admm-aux restart",
    "defaults": "",
}


def _run(args: argparse.Namespace, out: Path, name: str, flags: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "deepjimu", "train", "--quiet", "--runs-dir", str(out)]
    cmd += ["--name", name, "--dataset", args.dataset, "--data-dir", args.data_dir]
    cmd += ["--downsample", str(args.downsample), "--seed", str(args.seed), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "?"}
    events = [json.loads(x) for x in (out / name / "events.jsonl").read_text().splitlines() if x]
    summary = json.loads((out / name / "summary.json").read_text())
    at = {e["epoch"]: e.get("test_acc") for e in events}
    return {"at": at, "summary": summary}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--downsample", type=int, default=1)
    p.add_argument("--models", default="mlp:256x3,mlp:500x6,mlp:500x10")
    p.add_argument("--epochs", type=int, default=30, help="admm iterations (mini-batch: epochs)")
    p.add_argument("--report", default="10", help="also report test accuracy at these iterations")
    p.add_argument("--minibatch", type=int, default=0, help="mini-batch size (0: full batch)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="comma list of variant names to run")
    args = p.parse_args(argv)
    variants = MINI_BATCH if args.minibatch else FULL_BATCH
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(",")}
    report = [int(r) for r in args.report.split(",") if r]
    mode = f"mini-batch {args.minibatch}, {args.epochs} epochs" if args.minibatch else (
        f"full batch, {args.epochs} iterations"
    )  # fmt: skip
    print(f"admm ablation on {args.dataset} (downsample {args.downsample}), {mode}, "
          f"{args.workers} worker(s), seed {args.seed}")  # fmt: skip
    cols = "".join(f"{'test@' + str(r):>9}" for r in report)
    print(f"\n{'model':<11} {'variant':<22}{cols} {'test':>7} {'train':>7} {'train s':>8}  flags")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for model in args.models.split(","):
            rows: dict[str, dict[str, Any]] = {}
            adam = _run(args, out, f"adam-{model}", ["--strategy", "local", "--model", model])
            rows["adam (local)"] = adam
            for name, extra in variants.items():
                flags = ["--strategy", "admm", "--model", model, "--workers", str(args.workers)]
                flags += ["--epochs", str(args.epochs), *shlex.split(extra)]
                if args.minibatch:
                    flags += ["--admm-batch", str(args.minibatch)]
                rows[name] = _run(args, out, f"{name.replace(' ', '_')}-{model}", flags)
                rows[name]["flags"] = extra
            for name, r in rows.items():
                if "error" in r:
                    print(f"{model:<11} {name:<22} failed: {r['error']}")
                    continue
                s = r["summary"]
                at = "".join(f"{r['at'].get(k) or 0:>9.4f}" for k in report)
                if name.startswith("adam"):
                    at = "".join(f"{'':>9}" for _ in report)
                print(
                    f"{model:<11} {name:<22}{at} {s['test_acc']:>7.4f} {s['train_acc']:>7.4f} "
                    f"{s['train_s']:>8.2f}  {r.get('flags', '')}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
