"""Time deepjimu's ``ddp`` against plain torch DDP written here: same model, data, batch, epochs.

Both sides train the same ``nn.Sequential`` (deepjimu's model builder, same seed) on the same
rows (each rank its ``rank::world`` shard of the training split), with Adam, the same global
batch and the same number of steps per epoch, on ``--workers`` gloo ranks on the CPU.

- deepjimu: ``python -m deepjimu train --strategy ddp ...`` in its own process; the time of an
  epoch is, from its event in ``events.jsonl``, the largest per-rank training-loop time
  ``compute_s + wait_s`` (no process start-up, data loading or evaluation).
- plain: ``torch.multiprocessing.spawn`` + ``init_process_group("gloo")`` +
  ``DistributedDataParallel``; each rank times the same loop with ``perf_counter`` after a
  barrier (batches are cut before the timer, as deepjimu does); the epoch is the slowest rank.

Both sides take the slowest rank because rank 0 alone under-counts: deepjimu's rank 0 starts
an epoch after writing the previous event while rank 1 is already training, so the
``train_s`` of an event (rank 0's clock) misses that head start (see the report of this
benchmark).

The first ``--warmup`` epochs of each run are dropped; the figure per side is the median epoch
time over all remaining epochs of all rounds; rounds alternate the two sides so that
background load hits both alike. Prints the ratio deepjimu / plain of the medians (the issue
requires <= 1.05) and, as a check on a busy machine, the ratio of the fastest epochs.

Usage:
    python benchmarks/ddp_overhead.py [--epochs 10] [--rounds 5] [--model mlp:256x3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from deepjimu.data import DataOptions, load_dataset
from deepjimu.models import build_model
from deepjimu.strategies.base import epoch_order, split_steps
from deepjimu.worker import free_port

__all__ = ["deepjimu_epochs", "main", "plain_ddp_epochs"]


def _plain_worker(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    """One rank of plain DDP: the training loop a torch user would write."""
    world = args.workers
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # as deepjimu's workers
    dist.init_process_group("gloo", rank=rank, world_size=world)
    data = load_dataset(args.dataset, DataOptions(seed=args.seed)).shard(rank, world)
    model = build_model(args.model, data.feature_shape, data.num_classes, seed=args.seed)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    steps = -(-data.train_size // args.batch_size)
    times = []
    for epoch in range(args.epochs):
        order = epoch_order(len(data.train_y), args.seed, epoch)
        batches = [(data.train_x[i], data.train_y[i]) for i in split_steps(order, steps)]
        dist.barrier()
        t0 = time.perf_counter()
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - t0)
    every: list[list[float]] = [[] for _ in range(world)]
    dist.all_gather_object(every, times)
    if rank == 0:  # an epoch lasts until its slowest rank is done
        Path(out).write_text(json.dumps([max(ts) for ts in zip(*every, strict=True)]))
    dist.destroy_process_group()


def plain_ddp_epochs(args: argparse.Namespace) -> list[float]:
    """Seconds per epoch of plain torch DDP (the slowest rank's loop), every epoch."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.json")
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.workers)))
        mp.spawn(_plain_worker, args=(args, free_port(), out), nprocs=args.workers, join=True)
        return list(json.loads(Path(out).read_text()))


def deepjimu_epochs(args: argparse.Namespace, runs_dir: Path, name: str) -> list[float]:
    """Seconds per epoch of ``jimu train --strategy ddp`` (the slowest rank's loop), every epoch."""
    cmd = [sys.executable, "-m", "deepjimu", "train", "--strategy", "ddp"]
    cmd += ["--workers", str(args.workers), "--model", args.model, "--dataset", args.dataset]
    cmd += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
    cmd += ["--seed", str(args.seed), "--quiet", "--runs-dir", str(runs_dir), "--name", name]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    lines = (runs_dir / name / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    # each rank's training loop is its compute + wait; an epoch lasts until the slowest is done
    return [
        max(c + w for c, w in zip(e["compute_s_per_rank"], e["wait_s_per_rank"], strict=True))
        for e in events
    ]


def main(argv: list[str] | None = None) -> float:
    """Run the comparison, print per-round and overall figures; returns deepjimu / plain."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="epochs dropped at the start of each run")
    p.add_argument("--rounds", type=int, default=5, help="alternating runs of each side")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default="mlp:256x3")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.epochs <= args.warmup:
        p.error(f"--epochs must exceed --warmup (epochs: {args.epochs}, warmup: {args.warmup})")
    jimu, plain = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            j = deepjimu_epochs(args, Path(tmp), f"round{r}")[args.warmup :]
            q = plain_ddp_epochs(args)[args.warmup :]
            jimu += j
            plain += q
            print(
                f"round {r}: deepjimu {1e3 * statistics.median(j):.1f} ms/epoch, "
                f"plain {1e3 * statistics.median(q):.1f} ms/epoch",
                flush=True,
            )
    mj, mp_ = statistics.median(jimu), statistics.median(plain)
    ratio = mj / mp_
    fastest = min(jimu) / min(plain)
    print(
        f"{args.model} on {args.dataset}, batch {args.batch_size}, {args.workers} gloo workers, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    print(f"median epoch (after {args.warmup} warm-up epochs, {args.rounds} rounds):")
    print(f"  deepjimu ddp {1e3 * mj:.1f} ms   plain DDP {1e3 * mp_:.1f} ms")
    print(f"  fastest epoch: deepjimu {1e3 * min(jimu):.1f} ms   plain {1e3 * min(plain):.1f} ms")
    print(f"ratio deepjimu/plain = {ratio:.3f} (median; fastest epochs: {fastest:.3f}); limit 1.05")
    return ratio


if __name__ == "__main__":
    main()
