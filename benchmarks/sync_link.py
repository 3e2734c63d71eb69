"""Every ``--sync-plan`` method, and auto, over a real rate-capped link between two network namespaces.

The two-node counterpart of ``benchmarks/sync_plan.py`` (which runs on loopback): the
namespaces, veth pair, HTB rate cap and two-node ``torchrun`` of ``benchmarks/slow_link.py``
(one worker per namespace, one thread each), and per rate, workload and method one
``jimu train --strategy ddp --sync-plan METHOD`` at 16 rows per worker. Per method it
prints the median step past the first (``step_s``), the bytes one rank sent per step
against the planner's prediction (the run's own ``sync_plan.json``; for ``allreduce``,
torch's DDP, which saves no plan, the auto run's figure for all-reduce everywhere), and
auto's step over the best single method's.

The workloads are ``sync_plan.py``'s on fewer samples, so that a dense all-reduce of
``mlp:4096x3``'s 135 MB at 100 Mbit/s (about 11 s a step) ends in minutes: ``mlp`` on
``--dataset synthetic`` of 64 features and 10 classes, like digits (``--synthetic-n``,
default 400: 10 steps of 32 rows), ``embed`` on ``bow`` at ``--synthetic-n`` x 2. The
namespaces are removed afterwards, whatever happened; without root the script says so in
one line and exits 0.

With ``--interleaved PLAN ...`` it runs ``benchmarks/sync_interleaved.py`` over the link
instead: the plans stepped alternately in the same two processes, which separates steps
that differ by less than separate runs vary; it prints each plan's median step and the
first plan's over the last's.

Usage (as root, from the repository root):
    python benchmarks/sync_link.py --rates 100mbit,none [--only mlp|embed] [--rounds 1]
    python benchmarks/sync_link.py --rates none --only embed --interleaved "0.weight=sparse" ddp
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slow_link import cap_rate, make_namespaces, remove_namespaces, two_nodes
from sync_plan import WORKLOADS, figures

__all__ = ["main"]


def _flags(workload: str, n: int) -> list[str]:
    """The workload's ``jimu train`` flags on fewer samples (see the module docstring)."""
    flags = list(WORKLOADS[workload]["flags"])
    if workload == "mlp":
        at = flags.index("--dataset")
        flags[at : at + 2] = ["--dataset", "synthetic", "--synthetic-features", "64"]
        return [*flags, "--synthetic-n", str(n)]
    at = flags.index("--synthetic-n")
    flags[at + 1] = str(2 * n)
    return flags


def _table(rate: str, workload: str, runs: dict[str, list[dict[str, Any]]]) -> str:
    """One rate's and workload's table, as ``sync_plan.py`` prints it."""
    auto_plan = runs["auto"][0]["plan"]
    lines = [
        f"\n[{rate}] {workload}: 2 nodes x 1 worker, 16 rows per worker, median of {len(runs['auto'])}",
        "| method | step ms | sent/step | predicted | bytes error | predicted comm ms | test acc | plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    steps = {}
    for m, rs in runs.items():
        owns = [
            {"bytes": x["plan"]["bytes"], "seconds": x["plan"]["seconds"]}
            if m == "auto"
            else (x["plan"] or auto_plan)["single_methods"][m]
            for x in rs
        ]
        step = statistics.median(x["step_s"] for x in rs)
        sent = statistics.median(x["bytes"] for x in rs)
        error = statistics.median(
            x["bytes"] / o["bytes"] - 1 for x, o in zip(rs, owns, strict=True)
        )
        chosen = rs[0]["plan"]["methods"] if rs[0]["plan"] else {"DDP's buckets": 1}
        mix = ", ".join(f"{k} {v}" for k, v in chosen.items() if v)
        steps[m] = step
        lines.append(
            f"| {m} | {step * 1e3:.1f} | {sent / 1e6:.3f} MB | {owns[0]['bytes'] / 1e6:.3f} MB | "
            f"{error:+.1%} | {statistics.median(o['seconds'] for o in owns) * 1e3:.2f} | "
            f"{statistics.median(x['test_acc'] for x in rs):.3f} | {mix} |"
        )
    best = min((s, m) for m, s in steps.items() if m != "auto")
    lines.append(f"\nauto / best single method ({best[1]}): {steps['auto'] / best[0]:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Build the link, run every rate, workload and method; print the tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="100mbit,none", help="tc rates; none: uncapped")
    p.add_argument("--only", choices=sorted(WORKLOADS), default=None)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--synthetic-n", type=int, default=400, help="samples of the mlp workload")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument(
        "--out", default=None, help="folder for runs and logs (default: bench/sync-link-<time>)"
    )
    p.add_argument(
        "--interleaved",
        nargs="+",
        metavar="PLAN",
        help="instead of jimu train runs: these plans stepped alternately in the same two "
        "processes over the link (benchmarks/sync_interleaved.py's --plans, on --only's model)",
    )
    p.add_argument("--steps", type=int, default=300, help="steps of --interleaved")
    args = p.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("ip") is None:
        print("sync_link: needs root and iproute2 (network namespaces and tc); skipped")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = Path(args.out or f"bench/sync-link-{datetime.datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    workloads = [args.only] if args.only else list(WORKLOADS)
    tables, port = [], 29500
    remove_namespaces()
    try:
        make_namespaces()
        for rate in args.rates.split(","):
            cap_rate(rate)
            if args.interleaved:
                tables += [_interleaved(rate, w, args, out, port := port + 1) for w in workloads]
                print(tables[-1], flush=True)
                continue
            for workload in workloads:
                runs: dict[str, list[dict[str, Any]]] = {
                    m: [] for m in WORKLOADS[workload]["methods"]
                }
                for r in range(args.rounds):
                    for m in runs:
                        name = f"{rate}-{workload}-{m}-{r}"
                        print(f"[{rate}] {workload} {m} ...", end=" ", flush=True)
                        port += 1
                        cmd = ["train", "--strategy", "ddp", "--batch-size", "32", "--epochs", "1"]
                        cmd += [
                            *_flags(workload, args.synthetic_n),
                            "--sync-plan",
                            m,
                            "--threads",
                            "1",
                        ]
                        cmd += ["--quiet", "--runs-dir", str(out), "--name", name]
                        two_nodes(cmd, port, out / name, args.timeout)
                        runs[m].append(figures(out / name, 2))
                        print(f"{runs[m][-1]['step_s'] * 1e3:.1f} ms/step", flush=True)
                tables.append(_table(rate, workload, runs))
                print(tables[-1], flush=True)
    finally:
        remove_namespaces()
    print(f"\nruns in {out}\n" + "\n".join(tables))
    return 0


def _interleaved(rate: str, workload: str, args: argparse.Namespace, out: Path, port: int) -> str:
    """``--interleaved``: the plans stepped alternately over the link; rank 0's lines."""
    model = WORKLOADS[workload]["flags"][WORKLOADS[workload]["flags"].index("--model") + 1]
    script = str(Path(__file__).resolve().parent / "sync_interleaved.py")
    argv = ["--model", model, "--steps", str(args.steps), "--plans", *args.interleaved]
    if workload == "mlp":
        argv += ["--dataset", "synthetic"]
    log = out / f"{rate}-{workload}-interleaved"
    two_nodes(argv, port, log, args.timeout, program=(script,))
    lines = [ln for ln in log.with_suffix(".node0.log").read_text().splitlines() if " ms  " in ln]
    head = (
        f"\n[{rate}] {workload}: plans stepped alternately, 2 nodes x 1 worker, {args.steps} steps"
    )
    ms = [float(ln.split()[0]) for ln in lines]
    ratio = [f"first plan / last plan: {ms[0] / ms[-1]:.3f}"] if len(ms) > 1 else []
    return "\n".join([head, *lines, *ratio])


if __name__ == "__main__":
    sys.exit(main())
