"""deepjimu's gradient baselines against the plain PyTorch a user would write, in one run.

Two comparisons, each alternating its two sides round by round so that background load hits
both alike, each side training the same ``nn.Sequential`` (deepjimu's model builder, same
seed) on the same rows with Adam, the same batch size, epochs and evaluation schedule:

- ``local``: ``deepjimu.launch.train(strategy="local")`` in this process against a plain loop
  written below (shuffle, slice batches, or for text nanoGPT's random windows, zero_grad /
  forward / backward / step; after every
  epoch the accuracy on the train, validation and test splits, as ``jimu train`` evaluates).
  Compared: the whole fit (training + evaluation) and the training time alone.
- ``ddp``: ``python -m deepjimu train --strategy ddp`` against plain
  ``DistributedDataParallel`` started by ``torch.multiprocessing.spawn`` on ``--workers``
  gloo ranks (each rank its ``rank::world`` shard, ``cores / workers`` threads as deepjimu's
  workers have). Compared: epoch training time (the slowest rank's; no start-up, data
  loading or evaluation), median over the epochs after ``--warmup``.

Prints per-round figures, the medians and the ratios deepjimu / plain (the limits are 1.10
for local and 1.05 for ddp).

Usage:
    python benchmarks/baseline_overhead.py                      # both, digits, mlp:256x3
    python benchmarks/baseline_overhead.py --only local --dataset mnist \\
        --data-dir ../shared/data --downsample 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, DataSplits, load_dataset
from deepjimu.devices import free_port
from deepjimu.launch import train
from deepjimu.leave import group_started, leave_at_exit
from deepjimu.models import build_model
from deepjimu.strategies.base import epoch_order, split_steps
from deepjimu.threads import available_cores

__all__ = ["deepjimu_ddp_epochs", "deepjimu_local", "main", "plain_ddp_epochs", "plain_local"]


def _data(args: argparse.Namespace) -> DataSplits:
    opts = DataOptions(data_dir=Path(args.data_dir), seed=args.seed, downsample=args.downsample)
    return load_dataset(args.dataset, opts)


# ---- local ------------------------------------------------------------------------------------
@torch.no_grad()
def _accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    model.eval()
    acc = float((model(x).argmax(1) == y).float().mean())
    model.train()
    return acc


def _plain_batches(
    data: DataSplits, batch: int, g: torch.Generator
) -> Iterator[tuple[Tensor, Tensor]]:
    """An epoch's batches as a user writes them: the rows shuffled; for a language model,
    nanoGPT's ``get_batch``: windows stacked from random starts in the training text."""
    n = len(data.train_y)
    if data.stream is None:
        for idx in torch.randperm(n, generator=g).split(batch):
            yield data.train_x[idx], data.train_y[idx]
        return
    text, block = data.stream, data.feature_shape[0]
    for size in torch.arange(n).split(batch):
        ix = torch.randint(len(text) - block, (len(size),), generator=g)
        yield (
            torch.stack([text[i : i + block] for i in ix]),
            torch.stack([text[i + 1 : i + 1 + block] for i in ix]).long(),
        )


def plain_local(data: DataSplits, args: argparse.Namespace) -> dict[str, float]:
    """The training loop a PyTorch user writes; returns its train, eval and total seconds."""
    model = build_model(args.model, data.feature_shape, data.num_classes, seed=args.seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x_all, y_all = data.train_x, data.train_y
    g = torch.Generator().manual_seed(args.seed)
    train_s = eval_s = 0.0
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        for x, y in _plain_batches(data, args.batch_size, g):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        t1 = time.perf_counter()
        for x, y in ((x_all, y_all), (data.val_x, data.val_y), (data.test_x, data.test_y)):
            _accuracy(model, x, y)
        train_s += t1 - t0
        eval_s += time.perf_counter() - t1
    return {"train_s": train_s, "eval_s": eval_s, "total_s": train_s + eval_s}


def deepjimu_local(args: argparse.Namespace, runs_dir: Path, name: str) -> dict[str, float]:
    """``jimu train --strategy local`` in this process; its summary's train, eval and fit seconds."""
    given = {
        "strategy": "local",
        "model": args.model,
        "dataset": args.dataset,
        "data_dir": args.data_dir,
        "downsample": args.downsample,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "quiet": True,
        "runs_dir": str(runs_dir),
        "name": name,
        "lr_schedule": "constant",
    }
    if args.downsample == 1:  # images' option: not given where it would not apply
        del given["downsample"]
    # each option as given, so that no data family's defaults change them (text data's
    # would decay the rate, which the plain loop keeps constant)
    cfg = RunConfig(**given, given=dict.fromkeys(given, "flag"))  # type: ignore[arg-type]
    s = train(cfg)
    assert s is not None
    return {"train_s": s["train_s"], "eval_s": s["eval_s"], "total_s": s["fit_s"]}


def compare_local(args: argparse.Namespace) -> dict[str, float]:
    data = _data(args)
    sides: dict[str, list[dict[str, float]]] = {"deepjimu": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        deepjimu_local(args, Path(tmp), "warmup")
        plain_local(data, args)
        for r in range(args.rounds):
            j = deepjimu_local(args, Path(tmp), f"round{r}")
            q = plain_local(data, args)
            sides["deepjimu"].append(j)
            sides["plain"].append(q)
            print(
                f"local round {r}: deepjimu {j['total_s']:.2f} s (train {j['train_s']:.2f}), "
                f"plain {q['total_s']:.2f} s (train {q['train_s']:.2f})",
                flush=True,
            )
    med = {
        side: {k: statistics.median(r[k] for r in rows) for k in ("train_s", "eval_s", "total_s")}
        for side, rows in sides.items()
    }
    j, q = med["deepjimu"], med["plain"]
    print(
        f"\nlocal: {args.model} on {args.dataset} (downsample {args.downsample}), batch "
        f"{args.batch_size}, {args.epochs} epochs, evaluation of train/val/test every epoch, "
        f"{torch.get_num_threads()} threads, {args.rounds} rounds (medians)"
    )
    print(f"  {'':10} {'fit s':>8} {'train s':>8} {'eval s':>8}")
    for side, m in med.items():
        print(f"  {side:10} {m['total_s']:8.3f} {m['train_s']:8.3f} {m['eval_s']:8.3f}")
    ratios = {"fit": j["total_s"] / q["total_s"], "train": j["train_s"] / q["train_s"]}
    print(
        f"ratio deepjimu/plain: fit {ratios['fit']:.3f}, training alone {ratios['train']:.3f} "
        "(limit 1.10)"
    )
    return ratios


# ---- ddp --------------------------------------------------------------------------------------
def _plain_ddp_worker(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    """One rank of plain DDP: the training loop a torch user would write."""
    world = args.workers
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, available_cores() // world))  # as deepjimu's workers
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # leave without Python's shutdown, as deepjimu's workers do: gloo's threads aborted this
    # process at exit in 3 runs of 3 (2026-11-27), after its epochs were timed and written
    group_started()
    leave_at_exit(0)
    data = _data(args).shard(rank, world)
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
        mp.spawn(_plain_ddp_worker, args=(args, free_port(), out), nprocs=args.workers, join=True)
        return list(json.loads(Path(out).read_text()))


def deepjimu_ddp_epochs(args: argparse.Namespace, runs_dir: Path, name: str) -> list[float]:
    """Seconds per epoch of ``jimu train --strategy ddp``: the steps of its ``train_s`` clock."""
    cmd = [sys.executable, "-m", "deepjimu", "train", "--strategy", "ddp"]
    cmd += ["--workers", str(args.workers), "--model", args.model, "--dataset", args.dataset]
    cmd += ["--data-dir", args.data_dir, "--downsample", str(args.downsample)]
    cmd += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
    cmd += ["--seed", str(args.seed), "--quiet", "--runs-dir", str(runs_dir), "--name", name]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    lines = (runs_dir / name / "events.jsonl").read_text().splitlines()
    clock = [0.0] + [json.loads(line)["train_s"] for line in lines if line.strip()]
    return [b - a for a, b in itertools.pairwise(clock)]


def compare_ddp(args: argparse.Namespace) -> float:
    jimu, plain = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            j = deepjimu_ddp_epochs(args, Path(tmp), f"round{r}")[args.warmup :]
            q = plain_ddp_epochs(args)[args.warmup :]
            jimu += j
            plain += q
            print(
                f"ddp round {r}: deepjimu {1e3 * statistics.median(j):.1f} ms/epoch, "
                f"plain {1e3 * statistics.median(q):.1f} ms/epoch",
                flush=True,
            )
    mj, mq = statistics.median(jimu), statistics.median(plain)
    print(
        f"\nddp: {args.model} on {args.dataset}, global batch {args.batch_size}, {args.workers} "
        f"gloo workers, median epoch after {args.warmup} warm-up epochs, {args.rounds} rounds"
    )
    print(f"  deepjimu ddp {1e3 * mj:.1f} ms   plain DDP {1e3 * mq:.1f} ms")
    print(f"  fastest epoch: deepjimu {1e3 * min(jimu):.1f} ms   plain {1e3 * min(plain):.1f} ms")
    ratio = mj / mq
    print(f"ratio deepjimu/plain = {ratio:.3f} (median; limit 1.05)")
    return ratio


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the comparisons; returns the ratios deepjimu / plain."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("local", "ddp"), default=None, help="one comparison")
    p.add_argument("--model", default="mlp:256x3")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--downsample", type=int, default=1)
    p.add_argument("--epochs", type=int, default=None, help="default: 30 local, 10 ddp")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5, help="alternating runs of each side")
    p.add_argument("--warmup", type=int, default=2, help="ddp: epochs dropped at the start")
    p.add_argument("--workers", type=int, default=2, help="ddp workers")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(
        f"{available_cores()} cores, torch {torch.__version__}, OMP_WAIT_POLICY "
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    )
    ratios = {}
    if args.only in (None, "local"):
        local_args = argparse.Namespace(**{**vars(args), "epochs": args.epochs or 30})
        ratios |= {f"local_{k}": v for k, v in compare_local(local_args).items()}
    if args.only in (None, "ddp"):
        ddp_args = argparse.Namespace(**{**vars(args), "epochs": args.epochs or 10})
        if ddp_args.epochs <= args.warmup:
            p.error(
                f"--epochs must exceed --warmup (epochs: {ddp_args.epochs}, warmup: {args.warmup})"
            )
        ratios["ddp_train"] = compare_ddp(ddp_args)
    return ratios


if __name__ == "__main__":
    main()
