"""The event log: one JSON line per logged step (rank 0 writes), figures merged over ranks, the progress bar."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import torch

from deepjimu.atomic import append_whole, atomic_write_text
from deepjimu.bookkeeping import Bookkeeping
from deepjimu.clocks import CLOCKS
from deepjimu.comm import sum_by_kind
from deepjimu.counters import Counters
from deepjimu.memory import peak_memory_mb
from deepjimu.record.read import read_event_log

__all__ = ["EventLog", "merge_event"]


def merge_event(step: int, epoch: int, gathered: list[dict[str, Any]]) -> dict[str, Any]:
    """One event from every rank's report of the interval (pure: no I/O, no collectives).

    Each report holds the rank's ``metrics``, its :class:`~deepjimu.counters.Interval` as
    ``delta`` / ``kinds`` / ``train`` / ``samples`` / ``clocks`` / ``samples_total``, and
    its peak memory ``mem``. A metric is taken from the lowest rank that gives it a value
    that is not None. The clocks (:data:`~deepjimu.clocks.CLOCKS`) are rank 0's readings,
    one clock for the whole run, so ``train_s + eval_s <= fit_s <= time_s``; ``samples``
    is rank 0's training samples so far and ``samples_per_s`` its samples of the interval
    over its training time of the interval. Bytes are the interval's, summed over ranks;
    ``compute_s`` / ``wait_s`` the interval's largest per-rank values (the critical path).

    Returns:
        the event: the keys every strategy shares, then the merged metrics.
    """
    main = gathered[0]
    merged: dict[str, Any] = {}
    for g in gathered:
        for k, v in g["metrics"].items():
            if v is not None and k not in merged:
                merged[k] = v
    per_rank = list(zip(*[g["delta"] for g in gathered], strict=True))
    event: dict[str, Any] = {
        "step": step,
        "epoch": epoch,
        **{k: round(main["clocks"][k], 6) for k in CLOCKS},
        "loss": None,
        "train_acc": None,
        "val_acc": None,
        "test_acc": None,
        "samples": main["samples_total"],
        "samples_per_s": round(main["samples"] / main["train"], 3) if main["train"] else None,
        "bytes_sent": int(sum(per_rank[0])),
        "bytes_recv": int(sum(per_rank[1])),
        "bytes_sent_by_kind": sum_by_kind([g["kinds"] for g in gathered]),
        "compute_s": round(max(per_rank[2]), 6),
        "wait_s": round(max(per_rank[3]), 6),
        "bytes_sent_per_rank": [int(b) for b in per_rank[0]],
        "bytes_recv_per_rank": [int(b) for b in per_rank[1]],
        "compute_s_per_rank": [round(x, 6) for x in per_rank[2]],
        "wait_s_per_rank": [round(x, 6) for x in per_rank[3]],
        "peak_mem_mb_per_rank": [round(g["mem"], 1) for g in gathered],
    }
    event.update({k: _jsonable(v) for k, v in merged.items()})
    return event


class EventLog:
    """``events.jsonl`` of a run folder and the progress bar, both on rank 0 only.

    :meth:`log` is collective: every rank reports its interval (from ``counters``) and
    metrics through ``bookkeeping``, and rank 0 writes the merged event.

    Args:
        out_dir: the run folder.
        is_main: this rank writes (rank 0).
        quiet: no progress bar.
        counters: this rank's counters and clocks.
        bookkeeping: the collectives that gather the ranks' reports.
    """

    def __init__(
        self,
        out_dir: Path,
        is_main: bool,
        quiet: bool,
        counters: Counters,
        bookkeeping: Bookkeeping,
    ) -> None:
        self.path = out_dir / "events.jsonl"
        self.is_main, self.quiet = is_main, quiet
        self.counters, self.bookkeeping = counters, bookkeeping
        self._bar: Any = None
        self._resume_note: dict[str, Any] | None = None

    def progress(self, total: int, desc: str) -> None:
        """Start a progress bar on rank 0 (unless quiet) with ``total`` steps."""
        if self.is_main and not self.quiet:
            from tqdm.auto import tqdm

            # one bar in one process: a thread lock is enough. tqdm's default also takes a
            # multiprocessing lock, a named semaphore that a worker leaving by os._exit
            # (deepjimu.leave) never unlinks, so Python's resource tracker warned about it
            # under the one line that says why a run stopped
            tqdm.set_lock(threading.RLock())
            self._bar = tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True, leave=True)

    def progress_at(self, n: int) -> None:
        """Move the progress bar to ``n`` (after a resume)."""
        if self._bar is not None and n != self._bar.n:  # tqdm drew n = 0 as it started
            self._bar.n = n
            self._bar.refresh()

    def close(self) -> None:
        """Close the progress bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def log(self, step: int, epoch: int, samples: int = 0, **metrics: Any) -> dict[str, Any]:
        """Collective: write one event with ``metrics`` merged over ranks plus the counters.

        Each rank passes what it knows (e.g. the last pipeline stage passes ``loss``);
        :func:`merge_event` says how the reports combine. Byte, compute and wait figures
        are this interval's (``*_per_rank`` per rank); the clocks and ``samples`` are
        readings since the run began. ``samples`` (the argument) is the number of training
        samples processed since the last event (rank 0's), so ``samples_per_s`` is the
        interval's training throughput. The first event after :meth:`note_resumed` carries
        ``resumed``.

        Returns:
            the event, on every rank (only rank 0 writes it).
        """
        interval = self.counters.interval(samples)
        report = {
            "metrics": metrics,
            "delta": interval.delta,
            "kinds": interval.kinds,
            "mem": peak_memory_mb(self.counters.device),
            "samples": interval.samples,
            "train": interval.train_s,
            "clocks": interval.clocks,
            "samples_total": interval.samples_total,
        }
        gathered = self.bookkeeping.gather_objects(report)
        event = merge_event(step, epoch, gathered)
        if self._resume_note is not None:
            event["resumed"], self._resume_note = self._resume_note, None
        if not self.is_main:
            return event
        append_whole(self.path, json.dumps(event) + "\n")
        if self._bar is not None:
            post = {
                k: f"{event[k]:.4f}"
                for k in ("loss", "val_loss", "train_acc", "test_acc")
                if event.get(k) is not None
            }
            self._bar.set_postfix(post, refresh=False)
            self._bar.n = epoch
            self._bar.refresh()
        return event

    def drop_after(self, step: int) -> tuple[int, bool]:
        """Rank 0: keep only the events up to ``step``, rewriting the log atomically.

        Returns:
            how many events were dropped, and whether a last line cut short was left out.
        """
        if not self.path.exists():
            return 0, False
        events, torn = read_event_log(self.path.parent)
        kept = [e for e in events if e.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(e) + "\n" for e in kept))
        return len(events) - len(kept), torn is not None

    def note_resumed(self, note: dict[str, Any]) -> None:
        """Attach ``note`` as ``resumed`` to the next event."""
        self._resume_note = note


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
