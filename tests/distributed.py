"""Test helper: run a function on ``world`` real gloo ranks on 127.0.0.1 and collect the results."""

from __future__ import annotations

import io
import os
import queue
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepjimu.worker import free_port

__all__ = ["free_port", "run_world"]


def _entry(
    fn: Callable[..., Any], rank: int, world: int, port: int, out: Any, args: tuple[Any, ...]
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        result = fn(rank, world, *args)
        # plain bytes: torch's queue would share tensors through this process's file
        # descriptors, which are gone once it exits
        buf = io.BytesIO()
        torch.save(result, buf)
        out.put((rank, True, buf.getvalue()))
    except BaseException:
        out.put((rank, False, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes joined by a gloo group.

    ``fn`` must be importable (a module-level function). A rank that raises, dies or hangs
    past ``timeout`` seconds fails the test with that rank's traceback.

    Returns:
        the ranks' return values, in rank order.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world, port, out, args), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world):
            try:
                rank, ok, value = out.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"distributed test hung for {timeout} s (results from ranks {sorted(results)})"
                ) from None
            if ok:
                results[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                errors.append(f"rank {rank} failed:\n{value}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
