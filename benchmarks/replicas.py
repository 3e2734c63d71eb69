"""Two-dimensional runs (``--replicas``) against 1-D runs of the same worker count: memory, and bytes over a slow link.

``--memory`` (any user; loopback): admm with K = 2 blocks on 1 and 2 replicas (2 and 4
workers) and on 4 workers as 4 blocks, per data set: each rank's sample variables as the
strategy measures them on its tensors (``admm_sample_mb_per_rank``), its peak memory (the
process's, as every event reports it), the test accuracy, the training samples per second and
the bytes by kind. The 2-D run holds half the samples per rank; its iterates are the 1-D
run's, so the accuracies must agree.

``--link RATES`` (root): two network namespaces joined by a veth pair capped at each rate
(``benchmarks/slow_link.py``'s), two workers in each (a two-node torchrun job, one thread a
worker): ranks 0, 1 on the first node, 2, 3 on the second. A 1-D run of 4 workers crosses
the link once, in the middle of its chain (admm: every sample's p and q; pipeline: the
activations and gradients of every micro-batch); the 2 x 2 run keeps each replica's chain
on one node and crosses the link with the column's all-reduces only (admm: each block's
(W, b) statistics; pipeline: each stage's gradients, torch's DDP). The table gives seconds
per epoch, the bytes all ranks sent per epoch and the test accuracy.

Usage (from the repository root):
    python benchmarks/replicas.py --memory --datasets digits,synthetic
    python benchmarks/replicas.py --memory --datasets mnist --data-dir ../shared/data
    sudo python benchmarks/replicas.py --link 100mbit,none
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slow_link import cap_rate, make_namespaces, remove_namespaces, two_nodes

from deepjimu.record.read import read_events, read_summary
from deepjimu.units import format_bytes

__all__ = ["main"]

# the data sets of --memory: name -> jimu train flags (the model: admm's default, mlp:256x3)
DATASETS = {
    "digits": ["--dataset", "digits"],
    "mnist": ["--dataset", "mnist", "--downsample", "2"],
    "synthetic": ["--dataset", "synthetic", "--synthetic-n", "40000",
                  "--synthetic-features", "256"],
}  # fmt: skip
# (label, workers, replicas) of --memory
MESHES = [("1-D, 2 blocks", 2, 1), ("2 blocks x 2 replicas", 4, 2), ("1-D, 4 blocks", 4, 1)]


def _train(args: list[str], runs: Path, name: str) -> Path:
    cmd = [sys.executable, "-m", "deepjimu", "train", "--quiet", "--runs-dir", str(runs),
           "--name", name, *args]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return runs / name


def memory(datasets: list[str], data_dir: str | None, epochs: int, runs: Path) -> None:
    print("| data | mesh | sample MB per rank | peak MB per rank | test acc | samples/s | "
          "bytes sent (replicas) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for data in datasets:
        flags = [*DATASETS[data], "--epochs", str(epochs)]
        if data_dir is not None and data == "mnist":
            flags += ["--data-dir", data_dir]
        for label, workers, replicas in MESHES:
            folder = _train(
                [*flags, "--workers", str(workers), "--replicas", str(replicas)],
                runs, f"{data}-{workers}-{replicas}",
            )  # fmt: skip
            s, last = read_summary(folder), read_events(folder)[-1]
            kinds = s.get("bytes_sent_by_kind", {})
            print(
                f"| {data} | {label} | {s['admm_sample_mb_per_rank']} | "
                f"{last['peak_mem_mb_per_rank']} | {s['test_acc']:.4f} | "
                f"{s['samples_per_s']:.0f} | {format_bytes(s['bytes_sent'])} "
                f"({format_bytes(kinds.get('replicas', 0))}) |",
                flush=True,
            )


# (strategy, label, replicas, extra flags) of --link
LINKED = [
    ("admm", "admm 1-D x4", 1, []),
    ("admm", "admm 2 x 2", 2, []),
    ("pipeline", "pipeline 1-D x4", 1, ["--microbatches", "4", "--schedule", "1f1b"]),
    ("pipeline", "pipeline 2 x 2 (DDP)", 2, ["--microbatches", "4", "--schedule", "1f1b"]),
]


def link(rates: list[str], epochs: int, runs: Path) -> None:
    if os.geteuid() != 0:
        print("benchmarks/replicas.py --link needs root (network namespaces); skipped")
        return
    remove_namespaces()
    make_namespaces()
    port = 29700
    try:
        print("| link | run | s per epoch | sent per epoch | test acc |")
        print("|---|---|---|---|---|")
        for rate in rates:
            cap_rate(rate)
            for strategy, label, replicas, extra in LINKED:
                port += 1
                name = f"{strategy}-{replicas}-{rate}"
                jimu = ["train", "--strategy", strategy, "--replicas", str(replicas),
                        "--model", "mlp:256x3", "--epochs", str(epochs), "--threads", "1",
                        "--quiet", "--runs-dir", str(runs), "--name", name, *extra]  # fmt: skip
                two_nodes(jimu, port, runs / name, 3600, per_node=2)
                s = read_summary(runs / name)
                print(
                    f"| {rate} | {label} | {s['train_s'] / s['epochs']:.3f} | "
                    f"{format_bytes(s['bytes_sent'] // s['epochs'])} | {s['test_acc']:.4f} |",
                    flush=True,
                )
    finally:
        remove_namespaces()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", action="store_true", help="admm's memory per rank, R = 1, 2")
    parser.add_argument("--datasets", default="digits,synthetic", help="of --memory")
    parser.add_argument("--data-dir", default=None, help="where mnist is (--memory)")
    parser.add_argument("--link", default=None, help="rates over two namespaces (root)")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"# {datetime.date.today()}, {os.cpu_count()} cores; python benchmarks/replicas.py "
          + " ".join(argv if argv is not None else sys.argv[1:]))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        if args.memory:
            memory(args.datasets.split(","), args.data_dir, args.epochs, Path(tmp))
        if args.link:
            link(args.link.split(","), args.epochs, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
