"""Heterogeneous workers on one machine: an even split against ``--balance speed``, the ideal, and the plan.

Each worker runs in a CPU cgroup whose quota is its ``--emulate-speeds`` factor of its threads'
CPU time (needs root and a cpu cgroup controller; without them the script says so in one line
and exits 0). For every strategy and every set of factors it runs ``jimu train``:

- ``full``: every worker at full speed, ``--balance even`` (the reference);
- ``even``: the factors, ``--balance even`` (today's split: the slowest worker sets the pace);
- ``speed``: the factors, ``--balance speed`` (the work split by each worker's measured speed);

and gives the seconds per epoch (training time over epochs) of each, the ideal (the whole
work over the summed speeds: ``full`` x workers / sum of factors, communication not slowed),
and ``jimu plan``'s prediction of ``even`` and ``speed`` (``--cluster probe``, the factors
applied to the probed ranks). The speed-up is ``even`` over ``speed``.

Usage (as root, from the repository root):
    python benchmarks/hetero.py                                   # 1,0.3 and 1,0.5,0.25
    python benchmarks/hetero.py --factors 1,0.3 --strategies admm,ddp --epochs 4
    python benchmarks/hetero.py --strategies ddp --model mlp:1024x3 --train "--batch-size 512"
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from deepjimu.emulate import find_cpu_controller

__all__ = ["main"]

STRATEGIES = ("admm", "ddp", "pipeline", "model-parallel")


def _jimu(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepjimu", *args], capture_output=True, text=True, timeout=timeout
    )


PER_EPOCH: dict[str, float] = {}
"""Training samples per epoch, by strategy (from its runs' summaries)."""


def _epoch_s(runs: Path, name: str, args: list[str]) -> float | None:
    done = _jimu("train", *args, "--runs-dir", str(runs), "--name", name, "--quiet")
    if done.returncode != 0:
        print(f"  {name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)
        return None
    summary = json.loads((runs / name / "summary.json").read_text())
    PER_EPOCH[summary["strategy"]] = float(summary["samples"]) / float(summary["epochs"])
    return float(summary["train_s"]) / float(summary["epochs"])


def _predicted(
    out: Path, strategies: list[str], workers: int, common: list[str]
) -> dict[str, float]:
    """Samples per second that ``jimu plan`` predicts, by strategy."""
    done = _jimu(
        "plan", "--strategies", ",".join(strategies), "--workers", str(workers), *common,
        "--out", str(out),
    )  # fmt: skip
    if done.returncode != 0:
        print(f"  plan failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)
        return {}
    rows = json.loads((out / "plan.json").read_text())["rows"]
    return {r["strategy"]: r["predicted"]["samples_per_s"] for r in rows if r.get("predicted")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", default="1,0.3;1,0.5,0.25", help="factor sets, ';' between sets")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--model", default="mlp:256x3")
    ap.add_argument(
        "--train", default="", help="more jimu train flags for every run, e.g. '--batch-size 512'"
    )
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or find_cpu_controller() is None:
        print("hetero: needs root and a mounted cpu cgroup controller; nothing was run")
        return 0
    strategies = args.strategies.split(",")
    base = ["--model", args.model, "--epochs", str(args.epochs), *shlex.split(args.train)]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="jimu-hetero-") as tmp:
        runs = Path(tmp)
        for fs in args.factors.split(";"):
            factors = [float(f) for f in fs.split(",")]
            p = len(factors)
            emulate = ["--emulate-speeds", fs]
            predicted = {
                b: _predicted(
                    runs / f"plan-{fs}-{b}", strategies, p, [*base, *emulate, "--balance", b]
                )
                for b in ("even", "speed")
            }
            for s in strategies:
                common = ["--strategy", s, "--workers", str(p), *base]
                tag = f"{s}-{fs}"
                full = _epoch_s(runs, f"{tag}-full", [*common, "--balance", "even"])
                even = _epoch_s(runs, f"{tag}-even", [*common, *emulate, "--balance", "even"])
                speed = _epoch_s(runs, f"{tag}-speed", [*common, *emulate, "--balance", "speed"])
                row = {
                    "strategy": s, "factors": fs, "full": full, "even": even, "speed": speed,
                    "ideal": full * p / sum(factors) if full else None,
                    "plan_even": _seconds(s, predicted["even"].get(s)),
                    "plan_speed": _seconds(s, predicted["speed"].get(s)),
                }  # fmt: skip
                results.append(row)
                print(_line(row), flush=True)
    print(f"\n{datetime.date.today()}, {args.epochs} epochs of {args.model} {args.train}")
    print(
        "| strategy | factors | full s/epoch | even | speed | ideal | speed-up | speed / ideal | plan even | plan speed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(_line(r, markdown=True))
    return 0


def _seconds(strategy: str, samples_per_s: float | None) -> float | None:
    """A predicted epoch's seconds: the strategy's samples per epoch over the predicted rate."""
    if not samples_per_s or strategy not in PER_EPOCH:
        return None
    return PER_EPOCH[strategy] / samples_per_s


def _line(r: dict[str, Any], markdown: bool = False) -> str:
    def f(v: float | None) -> str:
        return f"{v:.3f}" if v is not None else "-"

    up = f"{r['even'] / r['speed']:.2f}x" if r["even"] and r["speed"] else "-"
    vs_ideal = f"{r['speed'] / r['ideal']:.2f}" if r["speed"] and r["ideal"] else "-"
    cells = [
        r["strategy"], r["factors"], f(r["full"]), f(r["even"]), f(r["speed"]), f(r["ideal"]),
        up, vs_ideal, f(r["plan_even"]), f(r["plan_speed"]),
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |" if markdown else "  ".join(cells)


if __name__ == "__main__":
    raise SystemExit(main())
