"""A real slow link on one machine: ddp over two network namespaces joined by a rate-capped veth pair.

Two namespaces (``jimu-slow-a``, ``jimu-slow-b``) are joined by a veth pair with the private
addresses 10.231.0.1 and 10.231.0.2; an HTB qdisc on both ends caps the rate in each
direction (netem is not used: it is not available on every machine; HTB is):

    tc qdisc add dev DEV root handle 1: htb default 10
    tc class add dev DEV parent 1: classid 1:10 htb rate 100mbit

For each rate, a real two-node ``torchrun --nnodes 2`` (one node, one worker per namespace;
c10d rendezvous on the first node's veth address; gloo bound to the veth with
GLOO_SOCKET_IFNAME) first runs ``jimu probe``, then ``jimu train --strategy ddp`` once per
``--compress`` option and once with ``auto``. The table gives, per rate and option, the
seconds per epoch (training time, warm-up steps included), the bytes one rank sends per step
past the warm-up, the test accuracy, and the step time the cost model predicts (from that
rate's probe; for ``auto``, from the probe it made itself) against the measured mean step
past the warm-up. A single-node ``jimu train --strategy ddp --workers 2`` with the same
options gives the reference accuracy of the two-node runs.

The namespaces are removed afterwards, also when a run fails or the script is interrupted,
and leftovers of an earlier run are removed first. Without root the script prints one line
and exits 0.

With ``--admm`` each rate also runs ``jimu train --strategy admm`` over the two nodes; with
``--plan`` each rate's probe also feeds ``jimu plan --cluster <probe.json>`` (the link as
probed, the model's work measured on this machine at one thread, as each node runs), and a
second table gives each run's predicted against measured samples per second (training
samples over training time, as ``jimu bench`` reports them).

Usage (as root, from the repository root):
    python benchmarks/slow_link.py                       # 100mbit, 1gbit, uncapped; 5 epochs
    python benchmarks/slow_link.py --rates 100mbit --options none,powersgd:4,auto --epochs 2
    python benchmarks/slow_link.py --rates 100mbit,none --options none,fp16,bf16 --admm --plan
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from deepjimu.cost.compress import CostModel
from deepjimu.cost.probe import read_probe
from deepjimu.errors import JimuError
from deepjimu.record.read import read_events, read_summary
from deepjimu.units import format_bytes

__all__ = ["main"]

NAMESPACES = ("jimu-slow-a", "jimu-slow-b")
DEVICES = ("jimu-slow-va", "jimu-slow-vb")
ADDRESSES = ("10.231.0.1", "10.231.0.2")
OPTIONS = "none,fp16,bf16,qsgd:8,powersgd:4,topk:0.01,auto"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def remove_namespaces() -> None:
    """Delete the namespaces (their veth ends, and so the pair, go with them); absent ones are fine."""
    for ns in NAMESPACES:
        _ip("netns", "del", ns, check=False)


def make_namespaces() -> None:
    """Create the two namespaces and the veth pair between them, addressed and up."""
    for ns in NAMESPACES:
        _ip("netns", "add", ns)
    _ip("link", "add", DEVICES[0], "type", "veth", "peer", "name", DEVICES[1])
    for ns, dev, addr in zip(NAMESPACES, DEVICES, ADDRESSES, strict=True):
        _ip("link", "set", dev, "netns", ns)
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def cap_rate(rate: str) -> None:
    """Cap both directions of the veth pair at ``rate`` (tc syntax, e.g. ``100mbit``); ``none`` uncaps."""
    for ns, dev in zip(NAMESPACES, DEVICES, strict=True):
        tc = ["ip", "netns", "exec", ns, "tc"]
        subprocess.run([*tc, "qdisc", "del", "dev", dev, "root"], capture_output=True, check=False)
        if rate == "none":
            continue
        # (tc warns that the class's quantum is big at these rates: harmless with one class)
        subprocess.run(
            [*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
            capture_output=True,
            check=True,
        )
        subprocess.run(
            [
                *tc,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:10",
                "htb",
                "rate",
                rate,
            ],
            capture_output=True,
            check=True,
        )


def two_nodes(
    jimu_args: list[str],
    port: int,
    log: Path,
    timeout: float,
    program: tuple[str, ...] = ("-m", "deepjimu"),
    per_node: int = 1,
) -> None:
    """Run ``python -m deepjimu <jimu_args>`` (or ``program``, a script or ``-m`` module, with
    those arguments) as a two-node torchrun job, one node per namespace, ``per_node`` workers
    a node (ranks 0 .. procs-1 on the first).

    Raises:
        RuntimeError: a node failed or the job timed out (its log named).
    """
    rid = uuid.uuid4().hex[:12]
    procs = []
    for i, (ns, dev, addr) in enumerate(zip(NAMESPACES, DEVICES, ADDRESSES, strict=True)):
        cmd = ["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={dev}", "OMP_NUM_THREADS=1"]
        cmd += [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            str(per_node),
        ]
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ADDRESSES[0]}:{port}"]
        cmd += ["--rdzv-id", rid, "--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", addr]
        cmd += [*program, *jimu_args]
        out = open(log.with_suffix(f".node{i}.log"), "w")  # noqa: SIM115 - closed below
        procs.append(
            (
                subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True),
                out,
            )
        )
    try:
        codes = [p.wait(timeout=timeout) for p, _ in procs]
    except subprocess.TimeoutExpired:
        codes = [None]
    finally:
        for p, out in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            out.close()
    if codes != [0, 0]:
        raise RuntimeError(
            f"two-node run {' '.join(jimu_args[:1])} failed (exit codes {codes}); see {log}.node*.log"
        )


def _row(run_dir: Path, option: str, probe_path: Path) -> dict[str, Any]:
    """The table's figures of one finished run folder."""
    events = read_events(run_dir)
    summary = read_summary(run_dir) or {}
    last = events[-1]
    prev_step = events[-2]["step"] if len(events) > 1 else 0
    if option == "auto":
        predicted = summary.get("predicted_step_s")
    else:
        predicted = CostModel(read_probe(probe_path)).predict(option).step_s
    measured = summary.get("step_s")
    return {
        "option": option if option != "auto" else f"auto -> {summary.get('compress')}",
        "s_per_epoch": summary["train_s"] / summary["epochs"],
        "bytes_per_step": last["bytes_sent_per_rank"][0] / (last["step"] - prev_step),
        "test_acc": summary.get("test_acc"),
        "predicted_s": predicted,
        "measured_s": measured,
    }


def _table(rows: dict[str, list[dict[str, Any]]], reference_acc: float | None) -> str:
    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        "| link | option | s/epoch | vs none | sent/step/rank | test acc | predicted step | measured step | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rate, rs in rows.items():
        none = next((r["s_per_epoch"] for r in rs if r["option"] == "none"), None)
        for r in rs:
            p, m = r["predicted_s"], r["measured_s"]
            lines.append(
                f"| {rate} | {r['option']} | {r['s_per_epoch']:.2f} | "
                f"{f(none / r['s_per_epoch'] if none else None, '.2f')}x | "
                f"{format_bytes(r['bytes_per_step'])} | {f(100 * r['test_acc'], '.2f')}% | "
                f"{f(p and 1e3 * p, '.1f')} ms | {f(m and 1e3 * m, '.1f')} ms | "
                f"{f((p - m) / m if p and m else None, '+.0%')} |"
            )
    if reference_acc is not None:
        lines.append(
            f"\nsingle-node ddp x2 (loopback, same options): test acc {100 * reference_acc:.2f}%"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Build the link, run every rate and option, print the table; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="100mbit,1gbit,none", help="tc rates; none: uncapped")
    p.add_argument("--options", default=OPTIONS, help=f"--compress options (default: {OPTIONS})")
    p.add_argument("--model", default="mlp:1024x4")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--train-args", default="", help="more jimu train flags for every run")
    p.add_argument(
        "--out", default=None, help="folder for runs and logs (default: bench/slow-link-<time>)"
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--admm", action="store_true", help="also run admm over the two nodes")
    p.add_argument(
        "--plan", action="store_true", help="predict every run with jimu plan from the rate's probe"
    )
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("slow_link: needs root (network namespaces and tc); skipped")
        return 0
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            print(f"slow_link: needs the {tool} command (iproute2); skipped")
            return 0
    # a plain kill (SIGTERM) unwinds through the finally blocks that remove the namespaces
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = Path(args.out or f"bench/slow-link-{datetime.datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = ["--model", args.model, "--epochs", str(args.epochs), "--threads", "1", "--quiet"]
    common += args.train_args.split()
    rows: dict[str, list[dict[str, Any]]] = {}
    checks: list[str] = []
    remove_namespaces()  # leftovers of an interrupted run
    port = 29400
    try:
        make_namespaces()
        for rate in args.rates.split(","):
            cap_rate(rate)
            runs = out / rate
            print(f"[{rate}] probe ...", flush=True)
            port += 1
            two_nodes(
                ["probe", *common, "--runs-dir", str(runs), "--name", "probe"],
                port,
                out / f"{rate}-probe",
                args.timeout,
            )
            rows[rate] = []
            for option in args.options.split(","):
                name = option.replace(":", "-")
                print(f"[{rate}] {option} ...", end=" ", flush=True)
                port += 1
                argv_ = [
                    "train",
                    "--strategy",
                    "ddp",
                    "--compress",
                    option,
                    *common,
                    "--runs-dir",
                    str(runs),
                    "--name",
                    name,
                ]
                try:
                    two_nodes(argv_, port, out / f"{rate}-{name}", args.timeout)
                    row = _row(runs / name, option, runs / "probe" / "probe.json")
                except (RuntimeError, JimuError, KeyError, IndexError) as e:
                    print(f"failed: {e}", flush=True)
                    continue
                rows[rate].append(row)
                print(
                    f"{row['s_per_epoch']:.2f} s/epoch, test acc {row['test_acc']:.4f}", flush=True
                )
            if args.admm:
                print(f"[{rate}] admm ...", end=" ", flush=True)
                port += 1
                argv_ = [
                    "train",
                    "--strategy",
                    "admm",
                    *common,
                    "--runs-dir",
                    str(runs),
                    "--name",
                    "admm",
                ]
                try:
                    two_nodes(argv_, port, out / f"{rate}-admm", args.timeout)
                    print(f"test acc {read_summary(runs / 'admm')['test_acc']:.4f}", flush=True)  # type: ignore[index]
                except (RuntimeError, JimuError, KeyError, TypeError) as e:
                    print(f"failed: {e}", flush=True)
            if args.plan:
                checks += _plan_check(rate, runs, args, common)
    finally:
        remove_namespaces()
    print("[reference] single-node ddp x2 ...", flush=True)
    ref = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepjimu",
            "train",
            "--strategy",
            "ddp",
            "--workers",
            "2",
            *common,
            "--runs-dir",
            str(out),
            "--name",
            "single-node",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    summary = read_summary(out / "single-node") if ref.returncode == 0 else None
    table = _table(rows, summary["test_acc"] if summary else None)
    header = f"{args.model}, digits, {args.epochs} epochs, {args.train_args or 'default flags'}; runs in {out}"
    print(f"\n{header}\n{table}")
    if checks:
        plan = "\n".join(
            [
                "| link | run | predicted samples/s | measured samples/s | error |",
                "|---|---|---|---|---|",
                *checks,
            ]
        )
        print(f"\njimu plan against the runs (from each rate's probe.json):\n{plan}")
        table += f"\n\njimu plan against the runs (from each rate's probe.json):\n\n{plan}"
    (out / "table.md").write_text(f"{header}\n\n{table}\n")
    return 0


def _plan_check(rate: str, runs: Path, args: argparse.Namespace, common: list[str]) -> list[str]:
    """``jimu plan`` on this rate's probe for the runs made at it; a table row per run."""
    options = [o for o in args.options.split(",") if o in ("none", "fp16", "bf16")]
    strategies = "ddp,admm" if args.admm else "ddp"
    cmd = [
        sys.executable,
        "-m",
        "deepjimu",
        "plan",
        "--cluster",
        str(runs / "probe" / "probe.json"),
    ]
    cmd += ["--strategies", strategies, "--workers", "2", "--models", args.model]
    cmd += ["--epochs", str(args.epochs), "--threads", "1", "--out", str(runs / "plan")]
    if options:
        cmd += ["--compress", ",".join(options)]
    cmd += args.train_args.split()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"[{rate}] jimu plan failed: {done.stderr.strip()}", flush=True)
        return []
    out = []
    for row in json.loads((runs / "plan" / "plan.json").read_text())["rows"]:
        option = row["options"].get("compress", "none")
        name = "admm" if row["strategy"] == "admm" else option.replace(":", "-")
        summary = read_summary(runs / name)
        if not summary or not row.get("predicted"):
            continue
        pred, real = row["predicted"]["samples_per_s"], summary["samples_per_s"]
        label = "admm" if row["strategy"] == "admm" else f"ddp --compress {option}"
        out.append(f"| {rate} | {label} | {pred:.0f} | {real:.0f} | {(pred - real) / real:+.0%} |")
    return out


if __name__ == "__main__":
    sys.exit(main())
