"""Every automatic choice against the default and each single alternative: ``--sync-plan auto`` in the same processes, ``--compress auto`` and ``--balance auto`` by repeated runs.

``--sync-plan auto`` (a per-step choice): for each workload, ``jimu train --sync-plan auto``
decides ``--repeats`` times in separate runs (each plans, then holds its plan to DDP in its
own trial: ``sync_plan.json``); then ``benchmarks/sync_interleaved.py`` steps, alternately
in the same two processes, torch's DDP, every plan those runs kept, and each single method
applied wherever it can (the rest all-reduced). Prints each plan's median step and, per
run, auto's step over the best single method's (DDP included): the figure ``--sync-plan
auto`` is held to (at most 1.05).

``--compress auto`` and ``--balance auto`` (whole-run choices): ``jimu train`` with auto,
the default and every alternative, in ``--repeats`` rounds (each round runs every variant
once, so the machine's drift over minutes moves them alike); prints each variant's median
samples/s and auto's against the default and the best (at least 0.95 of the default)::

    python benchmarks/auto_vs_default.py                        # everything, 3 runs each
    python benchmarks/auto_vs_default.py --workloads mlp --repeats 5 --choices sync
    python benchmarks/auto_vs_default.py --choices compress,balance
    python benchmarks/auto_vs_default.py --choices sync --link 100mbit,none --steps 12 --warm 2

``--link`` (root): the sync workloads over a real link between two network namespaces
(``benchmarks/slow_link.py``'s), each rate in turn, one worker and one thread a namespace.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from slow_link import cap_rate, make_namespaces, remove_namespaces, two_nodes  # noqa: E402

# name -> (model, dataset, extra train flags); 16 rows per rank and step, as issue 47 measured
WORKLOADS = {
    "embed": ("embed:100000:64", "bow", ["--synthetic-features", "100000"]),
    "mlp": ("mlp:4096x3", "digits", []),
    "embed-mlp": ("embed:100000:64:4096x2", "bow", ["--synthetic-features", "100000"]),
}
ROWS = 16


class Link:
    """Where the sync workloads run: two workers on 127.0.0.1 (``rate`` None), or one in each
    of two network namespaces over a veth pair capped at ``rate`` (``none``: uncapped), as
    ``benchmarks/sync_link.py`` runs them (a two-node torchrun job, one thread a worker)."""

    def __init__(self, rate: str | None) -> None:
        self.rate, self.port = rate, 29600

    def run(self, program: list[str], args: list[str], log: Path) -> str:
        """``program`` (``-m deepjimu`` or a script) with ``args`` on the two workers; the
        first worker's output."""
        if self.rate is None:
            workers = ["--workers", "2"] if program[-1] == "deepjimu" else []
            done = subprocess.run(
                [sys.executable, *program, *args, *workers],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            return done.stdout
        self.port += 1
        two_nodes([*args, *(["--threads", "1"] if program[-1] == "deepjimu" else [])],
                  self.port, log, 3600, program=tuple(program))  # fmt: skip
        return log.with_suffix(".node0.log").read_text()


def decide(name: str, runs: Path, i: int, link: Link) -> dict:
    """One ``jimu train --sync-plan auto`` run of workload ``name``: its ``sync_plan.json``."""
    model, dataset, extra = WORKLOADS[name]
    folder = f"{name}-{i}"
    args = [
        "train", "--strategy", "ddp", "--model", model, "--dataset", dataset, *extra,
        "--batch-size", str(2 * ROWS), "--optimizer", "sgd", "--lr", "0.05", "--balance",
        "even", "--sync-plan", "auto", "--epochs", "1", "--quiet", "--runs-dir", str(runs),
        "--name", folder,
    ]  # fmt: skip
    link.run(["-m", "deepjimu"], args, runs / folder)
    plan: dict = json.loads((runs / folder / "sync_plan.json").read_text())
    return plan


def as_text(plan: dict) -> str:
    """A kept plan as ``sync_interleaved.py`` takes it: ``ddp``, or its tensors' methods."""
    if plan["trial"]["kept"] == "DDP":
        return "ddp"
    return ",".join(
        f"{t['name']}={t['method']}" for t in plan["tensors"] if t["method"] != "allreduce"
    )


def singles(plan: dict) -> dict[str, str]:
    """Each single method applied wherever it can (the rest all-reduced), as plan texts."""
    out = {"ddp": "ddp"}
    for method in ("ps", "sfb", "sparse"):
        named = [t["name"] for t in plan["tensors"] if method in t["options"]]
        if named:
            out[method] = ",".join(f"{n}={method}" for n in named)
    return out


def interleaved(
    name: str, plans: list[str], steps: int, link: Link, runs: Path, warm: int = 10
) -> dict[str, float]:
    """Each plan's median step (ms), stepped alternately in the same two processes."""
    model, dataset, _ = WORKLOADS[name]
    args = [
        "--model", model, "--dataset", dataset, "--rows", str(ROWS), "--steps", str(steps),
        "--warm", str(warm), "--plans", *plans,
    ]  # fmt: skip
    out = link.run([str(HERE / "sync_interleaved.py")], args, runs / f"{name}-interleaved")
    times = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+) ms  (.*)$", line)
        if m:
            times[m.group(2)] = float(m.group(1))
    return times


# choice -> (the run's flags, the option, auto, the default, the alternatives)
WHOLE_RUNS = {
    "compress": (
        ["--strategy", "ddp", "--workers", "2", "--model", "mlp:1024x4", "--epochs", "3"],
        "--compress", "auto", "none", ["fp16", "bf16", "powersgd", "topk", "qsgd"],
    ),
    "balance": (
        ["--strategy", "ddp", "--workers", "2", "--model", "mlp:256x3", "--epochs", "5"],
        "--balance", "auto", "auto", ["even", "speed"],
    ),
    "balance-uneven": (  # one worker at half speed (a CPU quota: root)
        ["--strategy", "ddp", "--workers", "2", "--model", "mlp:256x3", "--epochs", "5",
         "--emulate-speeds", "1,0.5"],
        "--balance", "auto", "auto", ["even", "speed"],
    ),
}  # fmt: skip


def whole_runs(name: str, runs: Path, repeats: int) -> None:
    """``jimu train`` with each value of choice ``name``'s option, ``repeats`` rounds; prints
    each value's median samples/s and auto's over the default's and the best's."""
    flags, option, auto, default, others = WHOLE_RUNS[name]
    values = list(dict.fromkeys([auto, default, *others]))
    speeds: dict[str, list[float]] = {v: [] for v in values}
    for r in range(repeats):
        for v in values[r % len(values) :] + values[: r % len(values)]:  # each leads once
            folder = runs / f"{name}-{v}-{r}".replace(":", "_")
            cmd = [
                sys.executable, "-m", "deepjimu", "train", *flags, option, v, "--quiet",
                "--runs-dir", str(folder.parent), "--name", folder.name,
            ]  # fmt: skip
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            summary = json.loads((folder / "summary.json").read_text())
            speeds[v].append(summary["samples_per_s"])
    median = {v: statistics.median(s) for v, s in speeds.items()}
    best = max(median.values())
    print(f"\n{name} ({option}; {' '.join(flags)}; {repeats} rounds):")
    for v in values:
        label = f"{v} (auto)" if v == auto else f"{v} (default)" if v == default else v
        runs_text = ", ".join(f"{x:.0f}" for x in speeds[v])
        print(f"  {label:<16}{median[v]:>10.0f} samples/s  ({runs_text})")
    print(
        f"  {name}: auto over the default {median[auto] / median[default]:.3f}, "
        f"over the best {median[auto] / best:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--choices", default="sync," + ",".join(WHOLE_RUNS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="sync plan workloads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warm", type=int, default=10, help="untimed steps of each plan first")
    ap.add_argument(
        "--link",
        default=None,
        help="comma list of tc rates (none: uncapped): the sync workloads over two network "
        "namespaces at each (root), instead of 127.0.0.1",
    )
    args = ap.parse_args()
    runs = Path(tempfile.mkdtemp(prefix="auto-vs-default-"))
    choices = args.choices.split(",")
    for name in choices:
        if name in WHOLE_RUNS:
            whole_runs(name, runs, args.repeats)
    if "sync" not in choices:
        return
    if args.link is None:
        sync_choices(args, runs, Link(None))
        return
    remove_namespaces()
    try:
        make_namespaces()
        for rate in args.link.split(","):
            cap_rate(rate)
            print(f"\n== over two namespaces, {rate}", flush=True)
            sync_choices(args, runs / rate, Link(rate))
    finally:
        remove_namespaces()


def sync_choices(args: argparse.Namespace, runs: Path, link: Link) -> None:
    """``--sync-plan auto`` decided ``args.repeats`` times per workload, then every plan
    stepped alternately; prints the table."""
    runs.mkdir(parents=True, exist_ok=True)
    for name in args.workloads.split(","):
        decided = [decide(name, runs, i, link) for i in range(args.repeats)]
        single = singles(decided[0])
        kept = [as_text(p) for p in decided]
        texts = list(dict.fromkeys([*single.values(), *kept]))
        times = interleaved(name, texts, args.steps, link, runs, args.warm)
        best = min(times[t] for t in single.values())
        print(f"\n{name} ({WORKLOADS[name][0]}, {ROWS} rows per rank):")
        for label, text in single.items():
            print(f"  {label:<8}{times[text]:>10.3f} ms  {text if label != 'ddp' else ''}")
        worst = max(times[text] / best for text in kept)
        print(f"  {name}: auto over the best single method, worst of {len(kept)} runs: {worst:.3f}")
        for i, (plan, text) in enumerate(zip(decided, kept, strict=True)):
            trial = plan["trial"]
            print(
                f"  auto #{i + 1}: kept {trial['kept']} (trial: {trial['ratio']:.3f}x DDP, "
                f"spread {trial['spread']:.1%}); {times[text]:.3f} ms, "
                f"{times[text] / best:.3f}x the best single method"
            )


if __name__ == "__main__":
    main()
