"""Test helpers: run a function on ``world`` real gloo ranks on 127.0.0.1, or a test body on several worlds."""

from __future__ import annotations

import faulthandler
import gc
import importlib
import inspect
import io
import os
import queue
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo  # imported once here, not in every forked rank
import torch.distributed as dist
import torch.multiprocessing as mp

from deepjimu.devices import free_port

__all__ = ["distributed_test", "free_port", "run_world"]


_NOT_FORMED = "the process group did not form"


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    where: tuple[int, str, float],
    out: Any,
    args: tuple[Any, ...],
) -> None:
    port, store, timeout = where
    # a rank still running when the test gives up prints where it waits (the test's stderr)
    faulthandler.dump_traceback_later(max(timeout - 5, 1), exit=False, file=sys.stderr)
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
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"file://{store}")
    except BaseException:
        out.put((rank, False, f"{_NOT_FORMED}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None
    try:
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
        faulthandler.cancel_dump_traceback_later()
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    timeout: float = 120.0,
    start_method: str = "fork",
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` new processes joined by a gloo group.

    The ranks are forked from the test process (torch, and torch._dynamo that optimizers
    and DDP import, already loaded: a spawned rank spends about 3 s of CPU importing them)
    and run one thread each, as DataLoader's forked workers do, so OpenMP's pool is not
    touched after the fork. With ``start_method`` spawn (fresh interpreters) ``fn`` must be
    importable (a module-level function). A rank that raises, dies or hangs past
    ``timeout`` seconds fails the test with that rank's traceback.

    The ranks meet in a store file of their own (as torch's own multi-process tests do),
    not on a TCP port: a port free when chosen could be taken by another test's world
    before rank 0's store listened, and a rank of that world could join this one's store and
    leave both waiting on a dead peer (a hang seen in CI, with 4 test processes). A world
    that still fails in ``init_process_group``, before ``fn`` runs, starts again once. A
    failure in ``fn`` is never retried. A rank that dies without reporting fails the test
    at once, with its exit code.

    Returns:
        the ranks' return values, in rank order.
    """
    try:
        return _run_world(fn, world, args, timeout, start_method)
    except AssertionError as e:
        if _NOT_FORMED not in str(e):
            raise
        return _run_world(fn, world, args, timeout, start_method)


def _run_world(
    fn: Callable[..., Any], world: int, args: tuple[Any, ...], timeout: float, start_method: str
) -> list[Any]:
    ctx = mp.get_context(start_method)
    out = ctx.Queue()
    folder = tempfile.mkdtemp(prefix="jimu-world-")
    where = (free_port(), os.path.join(folder, "store"), timeout)
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world, where, out, args), daemon=True)
        for r in range(world)
    ]
    # what this process holds goes to the ranks frozen, never collected there: a finalizer
    # of it run by a rank's garbage collection could wait on a lock that one of this
    # process's other threads (xdist's) held at the fork, and the rank would hang (seen
    # once: both ranks of a world stuck in a traceback's allocation for 2 minutes)
    gc.freeze()  # (a spawned rank inherits nothing: there it changes nothing)
    try:
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        _collect(out, procs, timeout, results, errors)
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(folder, ignore_errors=True)
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]


def _collect(
    out: Any, procs: list[Any], timeout: float, results: dict[int, Any], errors: list[str]
) -> None:
    """Every rank's result into ``results``, or the first failure into ``errors``."""
    deadline, dead_since = time.monotonic() + timeout, None
    while len(results) < len(procs):
        try:
            rank, ok, value = out.get(timeout=1.0)
        except queue.Empty:
            silent = [r for r, p in enumerate(procs) if r not in results and p.exitcode is not None]
            if silent:
                # a rank's last message may still be in the pipe: a moment to drain it
                dead_since = dead_since or time.monotonic()
                if time.monotonic() - dead_since > 3.0:
                    codes = ", ".join(f"rank {r}: exit code {procs[r].exitcode}" for r in silent)
                    errors.append(f"a rank died without reporting ({codes})")
                    return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"distributed test hung for {timeout} s (results from ranks {sorted(results)})"
                ) from None
            continue
        if not ok:
            errors.append(f"rank {rank} failed:\n{value}")
            return
        results[rank] = torch.load(io.BytesIO(value), weights_only=False)


def distributed_test(
    world_size: Sequence[int] = (1, 2), timeout: float = 60.0, preload: Sequence[str] = ()
) -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """Decorator: run the test body on real gloo ranks, once per world size (a parametrized test).

    The body is ``body(rank, world)``, or ``body(rank, world, tmp)`` with ``tmp`` a folder
    that every rank shares (the test's ``tmp_path``); it asserts on each rank, and a rank
    that fails fails the test with its traceback (:func:`run_world`). The ranks are forked
    from the test process: a spawned rank imports torch afresh, several seconds each on a
    loaded CI machine against a fraction of one for a fork (each rank runs one thread, as
    DataLoader's forked workers do, so OpenMP's pool is not touched after the fork).
    ``preload`` names modules to import before the fork, once, that every rank would
    otherwise import anew (DDP's constructor imports ``torch._dynamo``: seconds each).

    Example:
        >>> @distributed_test(world_size=[1, 2, 3])
        ... def test_all_reduce_sums(rank: int, world: int) -> None:
        ...     t = torch.ones(1)
        ...     dist.all_reduce(t)
        ...     assert t.item() == world
    """

    def decorate(body: Callable[..., Any]) -> Callable[..., None]:
        wants_tmp = len(inspect.signature(body).parameters) == 3

        def test(world_size: int, tmp_path: Path) -> None:
            for name in preload:
                importlib.import_module(name)
            extra = [str(tmp_path)] if wants_tmp else []
            run_world(body, world_size, *extra, timeout=timeout, start_method="fork")

        test.__name__ = test.__qualname__ = body.__name__
        test.__module__, test.__doc__ = body.__module__, body.__doc__
        return pytest.mark.parametrize("world_size", list(world_size))(test)

    return decorate


def recording(cls: type) -> type:
    """``cls``, a strategy, that keeps every batch it trains on (``seen``), for a test to
    replay the same steps in one process."""

    class Recording(cls):  # type: ignore[misc, valid-type]
        seen: list[tuple[torch.Tensor, torch.Tensor]]

        def batches(
            self, data: Any, epoch: int, run: Any
        ) -> list[tuple[torch.Tensor, torch.Tensor]]:
            out = super().batches(data, epoch, run)
            self.seen = [*getattr(self, "seen", []), *out]
            return out

    Recording.__name__ = Recording.__qualname__ = f"Recording{cls.__name__}"
    return Recording
