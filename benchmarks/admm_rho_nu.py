"""Which rho, nu let pdADMM learn, and which runs admm's health check stops (digits, CPU).

For every (rho, nu) on a log grid, one full-batch ``admm`` run on 1 worker (``--model``,
``--iters`` iterations) through ``deepjimu.launch.train``. The table gives the training
accuracy at iterations 10 and ``--iters``, the relative fall of the training loss from
iteration 5 to 10 (what :class:`deepjimu.strategies.admm.health.Learning` judges: a run near
chance whose loss fell by less than ``health.STALL`` is stopped), and how the run ended: ok,
stopped (not learning) or failed (a factorisation).

Usage:
    python benchmarks/admm_rho_nu.py [--model mlp:32x2] [--iters 12] [--values 1e-4,1e-2,1,1e2,1e4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.launch import train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp:32x2")
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--values", default="1e-4,1e-2,1,1e2,1e4")
    args = p.parse_args()
    values = [float(v) for v in args.values.split(",")]
    print(f"| rho | nu | train acc @10 | train acc @{args.iters} | loss fall 5 -> 10 | end |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for rho in values:
            for nu in values:
                name = f"r{rho:g}-n{nu:g}"
                cfg = RunConfig(workers=1, model=args.model, epochs=args.iters, rho=rho, nu=nu,
                                quiet=True, threads=1, runs_dir=tmp, name=name)  # fmt: skip
                try:
                    train(cfg)
                    end = "ok"
                except JimuError as e:
                    end = "stopped" if "not learning" in str(e) else "failed"
                path = Path(tmp) / name / "events.jsonl"
                ev = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

                def acc(i: int, ev: list[dict] = ev) -> str:
                    return f"{ev[i - 1]['train_acc']:.3f}" if len(ev) >= i else "-"

                fall = (
                    f"{100 * (ev[4]['loss'] - ev[9]['loss']) / ev[4]['loss']:.2f}%"
                    if len(ev) >= 10
                    else "-"
                )
                print(
                    f"| {rho:g} | {nu:g} | {acc(10)} | {acc(args.iters)} | {fall} | {end} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
