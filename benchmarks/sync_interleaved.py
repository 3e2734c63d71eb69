"""Two sync plans timed in the same processes, step by step alternating: differences smaller than run-to-run noise.

Separate ``jimu train`` runs on a shared machine differ by 10-20% in step time; two plans
stepped alternately in the same two processes, on the same batches, see the same load.
Each plan is a comma list of ``tensor=method`` (tensors not named are all-reduced), applied
by :class:`deepjimu.compress.sync.SyncExecutor` on 2 gloo ranks on 127.0.0.1 (or, started
by torchrun, on its ranks: ``benchmarks/sync_link.py --interleaved`` runs it over a
rate-capped link between two network namespaces) with plain SGD (the embedding's gradient stays sparse); ``ddp`` is torch's DistributedDataParallel
itself (``ddp-counted``: with the comm hook that counts its bytes, as ``jimu train``
runs it), and a plan written ``gathered:...`` all-gathers sparse rows by hand (as on NCCL)
instead of handing them to gloo's own sparse all-reduce. Prints each plan's median step.

Usage:
    nice -n 5 python benchmarks/sync_interleaved.py --model embed:100000:64 \\
        --plans "0.weight=sparse" "0.weight=sparse,1.weight=sfb" ddp "gathered:0.weight=sparse"
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from deepjimu.comm import Comm, CommStats
from deepjimu.compress.hooks import comm_hook
from deepjimu.compress.sync import SyncExecutor
from deepjimu.data import DataOptions, load_dataset
from deepjimu.models import build_model, parse_spec
from deepjimu.options.compress import parse_compress

__all__ = ["main"]


def _rank(rank: int, world: int, args: argparse.Namespace, port: int | None) -> None:
    if port is not None:  # spawned here; under torchrun its environment says where
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    vocab = parse_spec(args.model).widths[0] if args.model.startswith("embed") else 196
    opts = DataOptions(synthetic_n=4000, synthetic_features=vocab)
    data = load_dataset(args.dataset, opts).shard(rank, world)
    setups: list[tuple[torch.nn.Module, Any, torch.optim.Optimizer]] = []
    for text in args.plans:
        model = build_model(args.model, data.feature_shape, data.num_classes)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if text in ("ddp", "ddp-counted"):  # torch's own: its reducer syncs in the backward
            ddp = DistributedDataParallel(model)
            if text == "ddp-counted":  # as jimu train runs it: its buckets counted by a hook
                ddp.register_comm_hook(
                    *comm_hook(parse_compress("none"), Comm(CommStats()), 0, torch.device("cpu"))
                )
            setups.append((ddp, _Done(), opt))
            continue
        native = not text.startswith("gathered:")
        methods = dict(
            item.split("=") for item in text.removeprefix("gathered:").split(",") if item
        )
        rows = {n: args.rows for n, m in methods.items() if m == "sfb"}
        sync = SyncExecutor(model, methods, Comm(CommStats()), rows, native=native)
        setups.append((model, sync, opt))
    times: list[list[float]] = [[] for _ in setups]
    n = len(data.train_y) - args.rows
    for i in range(args.steps):
        j = i * args.rows % n
        x, y = data.train_x[j : j + args.rows], data.train_y[j : j + args.rows]
        for k, (model, sync, opt) in enumerate(setups):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            sync.finish()
            opt.step()
            times[k].append(time.perf_counter() - t0)
    slowest = torch.tensor([t[args.warm :] for t in times], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step counts at its slowest rank
    if rank == 0:
        for text, row in zip(args.plans, slowest.tolist(), strict=True):
            print(f"{statistics.median(row) * 1e3:8.3f} ms  {text or '(all-reduce everywhere)'}")
    dist.destroy_process_group()


class _Done:
    """DDP's step needs no finishing: its reducer has synchronised by the end of backward."""

    def finish(self) -> None:
        pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embed:100000:64")
    p.add_argument("--dataset", default="bow")
    p.add_argument("--plans", nargs="+", required=True)
    p.add_argument("--rows", type=int, default=16, help="rows per rank and step")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warm", type=int, default=10)
    args = p.parse_args(argv)
    if "RANK" in os.environ:  # started by torchrun
        _rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, None)
        return
    from deepjimu.devices import free_port

    mp.spawn(_rank, args=(2, args, free_port()), nprocs=2)


if __name__ == "__main__":
    main()
