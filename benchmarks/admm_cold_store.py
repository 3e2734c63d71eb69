"""Kept mini-batches whose store is not in the page cache: reading the next batch ahead, against not.

``--admm-aux keep`` writes each batch's variables to files and reads them back at its next
visit. On this benchmark's machines the files stay in the page cache, so the reads cost a
memory copy; a run whose store is larger than the memory reads them from the disk. This
emulates that: after every save, the batch's rows are written to the disk (``fdatasync``)
and dropped from the cache (``POSIX_FADV_DONTNEED``), so that every load must read them.
Each epoch the strategy hints the batch visited next (``SampleStore.will_need``, a
``POSIX_FADV_WILLNEED``), so the system can read it while the current batch computes.

Both sides run in this process, alternating (``--repeats`` times each, median reported): the
hint as shipped, and the hint turned into a no-op. Printed per side: training seconds, the
seconds spent inside ``SampleStore.load`` and ``SampleStore.save``, and the ratios. The
save time includes the emulation's ``fdatasync`` (a real run leaves the write-back to the
system), so compare the load column.

Usage:
    python benchmarks/admm_cold_store.py --data-dir ../shared/data      # MNIST subset, 14 x 14
    python benchmarks/admm_cold_store.py --data-dir ../shared/data --warm   # the page cache's case
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from deepjimu.config import RunConfig
from deepjimu.launch import train
from deepjimu.strategies.admm.store import SampleStore


@contextlib.contextmanager
def cold_store(hint: bool, spent: dict[str, float], cold: bool = True) -> Iterator[None]:
    """For the block: with ``cold``, every save leaves its rows on disk only; loads and
    saves are timed; with ``hint`` False, ``will_need`` does nothing."""
    save, load, will_need = SampleStore.save, SampleStore.load, SampleStore.will_need

    def cold_save(self: SampleStore, k: int, tensors: Any) -> None:
        t = time.perf_counter()
        save(self, k, tensors)
        lo, hi = self.bounds[k], self.bounds[k + 1]
        for f, shape, dtype in self._files.values() if cold else []:
            row = math.prod(shape) * dtype.itemsize
            os.fdatasync(f.fileno())
            os.posix_fadvise(f.fileno(), lo * row, (hi - lo) * row, os.POSIX_FADV_DONTNEED)
        spent["save"] += time.perf_counter() - t

    def timed_load(self: SampleStore, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = load(self, *args, **kwargs)
        spent["load"] += time.perf_counter() - t
        return out

    SampleStore.save = cold_save  # type: ignore[method-assign]
    SampleStore.load = timed_load  # type: ignore[method-assign]
    if not hint:
        SampleStore.will_need = lambda self, k: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        SampleStore.save, SampleStore.load = save, load  # type: ignore[method-assign]
        SampleStore.will_need = will_need  # type: ignore[method-assign]


def run_once(args: argparse.Namespace, hint: bool, runs_dir: str, i: int) -> dict[str, float]:
    spent = {"load": 0.0, "save": 0.0}
    cfg = RunConfig(
        strategy="admm",
        workers=1,
        model=args.model,
        dataset="mnist",
        data_dir=args.data_dir,
        downsample=2,
        admm_batch=args.batch,
        admm_aux="keep",
        admm_readout="iterate",
        epochs=args.epochs,
        eval_every=args.epochs,
        quiet=True,
        runs_dir=runs_dir,
        name=f"{'hint' if hint else 'none'}-{i}",
    )
    with cold_store(hint, spent, cold=not args.warm):
        summary = train(cfg)
    assert summary is not None
    return {"train_s": summary["train_s"], **spent, "test_acc": summary["test_acc"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--model", default="mlp:500x6")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warm", action="store_true", help="leave the store in the page cache")
    args = ap.parse_args()
    sides: dict[str, list[dict[str, float]]] = {"read ahead": [], "no hint": []}
    with tempfile.TemporaryDirectory(prefix="jimu-cold-") as runs_dir:
        for i in range(args.repeats):
            for name, hint in (("no hint", False), ("read ahead", True)):
                sides[name].append(run_once(args, hint, runs_dir, i))
    med = {
        n: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for n, rows in sides.items()
    }
    where = "warm (in the page cache)" if args.warm else "cold"
    print(f"{args.model}, batch {args.batch}, {args.epochs} epochs, {where} store")
    print(f"median of {args.repeats} runs a side, alternating")
    print(f"{'side':<11} {'train s':>8} {'load s':>7} {'save s':>7} {'test':>6}")
    for n, m in med.items():
        print(f"{n:<11} {m['train_s']:8.2f} {m['load']:7.2f} {m['save']:7.2f} {m['test_acc']:6.3f}")
    a, b = med["no hint"], med["read ahead"]
    print(
        f"no hint / read ahead: train {a['train_s'] / b['train_s']:.2f}x, load {a['load'] / b['load']:.2f}x"
    )


if __name__ == "__main__":
    main()
