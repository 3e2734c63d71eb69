"""Test accuracy at the best validation epoch on a graph data set, mean and std over seeds.

Each configuration runs as ``python -m deepjimu train ... --seed S`` once per seed (the
public split is fixed; the seed changes the initial weights, batch order and dropout);
the table reads each run's summary.json. Example (the BENCHMARKS.md table, Cora):

    python benchmarks/graph_accuracy.py --data-dir ../shared/data
    python benchmarks/graph_accuracy.py --data-dir ../shared/data --only gcn,adam --seeds 0,1
    python benchmarks/graph_accuracy.py --data-dir ../shared/data --only admm-rho --seeds 0 \\
        --admm-grid 0.1:0.1,10:1 --admm "--graph-features concat --graph-hops 4 --epochs 30" \\
        --runs-dir runs/graph-accuracy-gamlp     # admm x1 at several rho:nu, nothing else

A finished run (its summary.json under --runs-dir) is read, not run again: give each
variant of --model / --admm its own --runs-dir.

Times are each run's training time (``time_s``) on this machine: indicative only when the
machine is shared.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

SGC = "--graph-features last --graph-hops 2"  # A_hat^2 X (SGC's input), the default
GA_MLP = "--graph-features concat --graph-hops 4"  # [X, A_hat X, ..., A_hat^4 X] (pdADMM-G's)
# label -> jimu train flags (besides data set, data dir, seed); {model} and {admm} are
# the --model and --admm options, so that one flag changes every row that uses them
CONFIGS: dict[str, str] = {
    "gcn": "--strategy local --model gcn --lr 0.01 --weight-decay 5e-4 --epochs 200",
    "adam-sgc": f"--strategy local --model {{model}} {SGC} --epochs 100",
    "adam-gamlp": f"--strategy local --model {{model}} {GA_MLP} --epochs 100",
    "admm-w1": "--strategy admm --workers 1 --model {model} {admm}",
    "admm-w2": "--strategy admm --workers 2 --model {model} {admm}",
    "admm-w3": "--strategy admm --workers 3 --model {model} {admm}",
    "admm-w2-q8": "--strategy admm --workers 2 --model {model} {admm} --quantize 8",
}


def run_one(label: str, flags: str, seed: int, args: argparse.Namespace) -> dict[str, object]:
    """Run one configuration with one seed (or reuse its finished run); its summary."""
    name = f"{label}-s{seed}"
    folder = Path(args.runs_dir) / name
    if not (folder / "summary.json").exists():
        cmd = [
            sys.executable, "-m", "deepjimu", "train", *shlex.split(flags),
            "--dataset", args.dataset, "--data-dir", args.data_dir, "--seed", str(seed),
            "--runs-dir", args.runs_dir, "--name", name, "--quiet",
        ]  # fmt: skip
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{name} failed ({shlex.join(cmd)}):\n{r.stderr[-2000:]}")
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return json.loads((folder / "summary.json").read_text())


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {std:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="cora")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--runs-dir", default="runs/graph-accuracy")
    p.add_argument("--only", default="", help="comma list of labels or label prefixes")
    p.add_argument(
        "--model", default="mlp:256x2", help="MLP of the adam and admm rows (3 blocks: 3 workers)"
    )
    p.add_argument(
        "--admm",
        default=f"{SGC} --epochs 50",
        help=f"flags of every admm row (default: %(default)s; pdADMM-G's input: {GA_MLP})",
    )
    p.add_argument(
        "--admm-grid", default="", help="rho:nu,... : one admm x1 row per pair (admm-rho-nu)"
    )
    args = p.parse_args()
    configs = dict(CONFIGS)
    for pair in filter(None, args.admm_grid.split(",")):
        rho, nu = pair.split(":")
        configs[f"admm-rho{rho}-nu{nu}"] = f"{CONFIGS['admm-w1']} --rho {rho} --nu {nu}"
    wanted = [w for w in args.only.split(",") if w]
    if wanted:
        configs = {k: v for k, v in configs.items() if any(k.startswith(w) for w in wanted)}
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for label, template in configs.items():
        flags = template.format(model=args.model, admm=args.admm)
        runs = [run_one(label, flags, s, args) for s in seeds]
        rows.append(
            (
                label,
                flags,
                _mean_std([r["test_acc_at_best_val"] for r in runs]),  # type: ignore[misc]
                _mean_std([r["best_val_acc"] for r in runs]),  # type: ignore[misc]
                _mean_std([r["test_acc"] for r in runs]),  # type: ignore[misc]
                f"{statistics.mean(float(r['time_s']) for r in runs):.1f}",  # type: ignore[arg-type]
                f"{statistics.mean(int(r['bytes_sent']) for r in runs) / 2**20:.1f}",  # type: ignore[call-overload]
            )
        )
    print(f"{args.dataset}, seeds {args.seeds}; test accuracy at the best validation epoch")
    print()
    print(
        "| run | flags | test acc at best val | best val acc | final test acc | fit s | MiB sent |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(f"`{c}`" if i == 1 else c for i, c in enumerate(row)) + " |")


if __name__ == "__main__":
    main()
