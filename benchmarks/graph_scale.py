"""Time and peak memory of generating and preprocessing a large ``sbm`` graph, in a fresh process.

Example (the issue's scale: 1,000,000 nodes, 10,000,000 edges):
    python benchmarks/graph_scale.py --nodes 1000000 --degree 20 --features 196 \\
        --hops 4 --mode concat

Prints the data layer's own figures (generation ``load_s``, ``preprocess_s`` for A_hat and
the propagated rows, the rows' and A_hat's sizes) and the process's peak resident memory
(``ru_maxrss``: everything this process ever held, Python and torch included).
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import torch

from deepjimu.data import DataOptions, load_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument(
        "--degree", type=float, default=20.0, help="average degree (edges: nodes * degree / 2)"
    )
    p.add_argument("--features", type=int, default=196)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--hops", type=int, default=4)
    p.add_argument("--mode", choices=("concat", "last"), default="concat")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    opts = DataOptions(
        synthetic_n=args.nodes,
        synthetic_features=args.features,
        synthetic_classes=args.classes,
        sbm_degree=args.degree,
        graph_hops=args.hops,
        graph_features=args.mode,
    )
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    data = load_dataset("sbm", opts)
    total = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = sum(len(y) for y in (data.train_y, data.val_y, data.test_y))
    print(
        f"sbm: {args.nodes:,} nodes, degree {args.degree:g}, {args.features} features, "
        f"{args.mode} K={args.hops}; torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads, {platform.machine()}"
    )
    for key, value in data.info.items():
        print(f"  {key}: {value}")
    print(f"  rows: {rows:,} x {data.feature_shape[0]:,}")
    print(f"  total load_dataset: {total:.1f} s")
    print(f"  peak RSS: {peak:,.0f} MiB (before loading: {rss0:,.0f} MiB)")


if __name__ == "__main__":
    main()
