"""Run: what every strategy gets besides the model and data (rank, device, events, timers, checkpoints)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from deepjimu.atomic import atomic_path, atomic_write_text
from deepjimu.comm import Comm, CommStats, sum_by_kind
from deepjimu.config import RunConfig
from deepjimu.errors import JimuError
from deepjimu.memory import peak_memory_mb
from deepjimu.precision import autocast
from deepjimu.report import read_event_log
from deepjimu.rundir import latest_checkpoint

__all__ = ["Checkpoint", "Run", "peak_memory_mb"]


def _torch_save_atomic(obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


@dataclass
class Checkpoint:
    """A loaded checkpoint: progress counters, the full model state and this rank's own state.

    ``time_s`` and ``fit_s`` are the run's clocks when it was written, and ``counters`` this
    rank's byte and time counters (see :meth:`Run.continue_history`).
    """

    step: int
    epoch: int
    model_state: dict[str, Any]
    rank_state: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    time_s: float = 0.0
    fit_s: float = 0.0
    counters: dict[str, Any] | None = None


class Run:
    """Context of one training run on one rank.

    Holds the rank/world/device, the :class:`~deepjimu.comm.Comm` byte counter, timers, the
    event log (``events.jsonl``, written by rank 0 only) and checkpoints. Methods marked
    *collective* must be called by every rank at the same point.

    Args:
        cfg: the validated config.
        out_dir: the run folder (``runs/<name>``); every rank knows it, rank 0 writes it.
        rank, world: this process in the default process group (0, 1 without one).
        device: where this rank computes.
    """

    def __init__(
        self,
        cfg: RunConfig,
        out_dir: Path,
        rank: int = 0,
        world: int = 1,
        device: torch.device | None = None,
    ) -> None:
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.rank, self.world = rank, world
        self.device = device or torch.device("cpu")
        self.stats = CommStats()
        self.comm = Comm(self.stats)
        self.is_main = rank == 0
        self._t0 = time.perf_counter()
        self._fit_t0: float | None = None
        self._before_s = self._before_fit_s = 0.0  # the clocks of the history this run continues
        self._last: list[float] = [0.0, 0.0, 0.0, 0.0]
        self._train_s = 0.0  # since the last event
        self._eval_s = 0.0
        self._last_kinds: dict[str, int] = {}
        self._bar: Any = None
        self._resume_note: dict[str, Any] | None = None
        self.resumed: Checkpoint | None = None
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)

    # ---- timing -------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since the run started on this rank (a resumed run goes on from its checkpoint's)."""
        return self._before_s + time.perf_counter() - self._t0

    def begin_fit(self) -> None:
        """Start the fit clock (:meth:`fit_s`): called just before ``Strategy.fit``."""
        self._fit_t0 = time.perf_counter()

    def fit_s(self) -> float:
        """Seconds spent in ``Strategy.fit`` over the whole run, resumed segments included."""
        now = time.perf_counter() - self._fit_t0 if self._fit_t0 is not None else 0.0
        return self._before_fit_s + now

    def synchronize(self) -> None:
        """Wait for queued device work, so that host timers measure it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """Time a block as training: its wall time is training time (``train_s``), of which
        the time blocked on messages counted by Comm is wait and the rest compute."""
        wait0 = self.stats.wait_s
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.synchronize()
            wall = time.perf_counter() - t0
            self._train_s += wall
            self.stats.compute_s += wall - (self.stats.wait_s - wait0)

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Time a block as evaluation (``eval_s``), kept apart from training time.

        Time-to-accuracy counts training time only, so a strategy that evaluates more
        often is not penalised.
        """
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.synchronize()
            self._eval_s += time.perf_counter() - t0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for training compute in the run's ``--precision`` (bf16: torch.autocast)."""
        return autocast(self.cfg.precision, self.device)

    # ---- collectives for bookkeeping (not counted as training traffic) ----------------------
    def barrier(self) -> None:
        """Collective: wait for every rank."""
        if self.world > 1:
            dist.barrier()

    def gather_objects(self, obj: Any) -> list[Any]:
        """Collective: every rank's ``obj``, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Collective: ``obj`` of rank ``src`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    # ---- events ---------------------------------------------------------------------------
    def progress(self, total: int, desc: str) -> None:
        """Start a progress bar on rank 0 (unless ``--quiet``) with ``total`` steps."""
        if self.is_main and not self.cfg.quiet:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True, leave=True)

    def progress_at(self, n: int) -> None:
        """Move the progress bar to ``n`` (after a resume)."""
        if self._bar is not None:
            self._bar.n = n
            self._bar.refresh()

    def log(self, step: int, epoch: int, samples: int = 0, **metrics: Any) -> dict[str, Any]:
        """Collective: write one event with ``metrics`` merged over ranks plus the counters.

        Each rank passes what it knows (e.g. the last pipeline stage passes ``loss``); a key
        is taken from the lowest rank that gives it a value that is not None. Byte, compute
        and wait figures are this interval's, gathered from every rank (``*_per_rank``);
        ``bytes_sent`` / ``bytes_recv`` are their sums, ``compute_s`` / ``wait_s`` the
        largest per-rank value (the critical path). ``train_s`` and ``eval_s`` are the time
        spent in :meth:`training` and :meth:`evaluation` blocks since the last event (the
        slowest rank's); ``samples`` is the number of training samples processed since the
        last event (rank 0's), so ``samples_per_s`` is training throughput.

        Returns:
            the event, on every rank (only rank 0 writes it).
        """
        current = self.stats.as_list()
        delta = [c - p for c, p in zip(current, self._last, strict=True)]
        self._last = current
        kinds = dict(self.stats.sent_by_kind)
        kinds_delta = {k: n - self._last_kinds.get(k, 0) for k, n in kinds.items()}
        self._last_kinds = kinds
        gathered = self.gather_objects(
            {
                "metrics": metrics,
                "delta": delta,
                "kinds": kinds_delta,
                "mem": peak_memory_mb(self.device),
                "samples": samples,
                "train": self._train_s,
                "eval": self._eval_s,
            }
        )
        self._train_s = self._eval_s = 0.0
        # the slowest rank's times: ranks start an epoch at slightly different times
        train_s = max(g["train"] for g in gathered)
        eval_s = max(g["eval"] for g in gathered)
        merged: dict[str, Any] = {}
        for g in gathered:
            for k, v in g["metrics"].items():
                if v is not None and k not in merged:
                    merged[k] = v
        per_rank = list(zip(*[g["delta"] for g in gathered], strict=True))
        compute_busy = max(per_rank[2])
        event: dict[str, Any] = {
            "step": step,
            "epoch": epoch,
            "time_s": round(self.elapsed(), 6),
            "loss": None,
            "train_acc": None,
            "val_acc": None,
            "test_acc": None,
            "samples_per_s": round(gathered[0]["samples"] / train_s, 3) if train_s else None,
            "train_s": round(train_s, 6),
            "eval_s": round(eval_s, 6),
            "bytes_sent": int(sum(per_rank[0])),
            "bytes_recv": int(sum(per_rank[1])),
            "bytes_sent_by_kind": sum_by_kind([g["kinds"] for g in gathered]),
            "compute_s": round(compute_busy, 6),
            "wait_s": round(max(per_rank[3]), 6),
            "bytes_sent_per_rank": [int(b) for b in per_rank[0]],
            "bytes_recv_per_rank": [int(b) for b in per_rank[1]],
            "compute_s_per_rank": [round(x, 6) for x in per_rank[2]],
            "wait_s_per_rank": [round(x, 6) for x in per_rank[3]],
            "peak_mem_mb_per_rank": [round(g["mem"], 1) for g in gathered],
        }
        event.update({k: _jsonable(v) for k, v in merged.items()})
        if self._resume_note is not None:
            event["resumed"], self._resume_note = self._resume_note, None
        if not self.is_main:
            return event
        with open(self.out_dir / "events.jsonl", "a") as f:
            f.write(json.dumps(event) + "\n")
        if self._bar is not None:
            post = {
                k: f"{event[k]:.4f}"
                for k in ("loss", "train_acc", "test_acc")
                if event[k] is not None
            }
            self._bar.set_postfix(post, refresh=False)
            self._bar.n = epoch
            self._bar.refresh()
        return event

    def close(self) -> None:
        """Close the progress bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ---- checkpoints ------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoint"

    def last_checkpoint_text(self) -> str:
        """Where the latest checkpoint is, or "none" (for error messages)."""
        latest = self.checkpoint_dir / "latest"
        return str(self.checkpoint_dir / latest.read_text().strip()) if latest.exists() else "none"

    def save_checkpoint(
        self,
        step: int,
        epoch: int,
        model: nn.Module | None,
        rank_state: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Collective: write a checkpoint atomically; the previous one stays until this is whole.

        Rank 0 passes the full model (the others may pass None); every rank passes its own
        ``rank_state`` (optimizer, ADMM variables, ...). Files go into a temporary folder
        that is renamed into place once every rank has written, then ``latest`` is switched.
        Besides the state, ``meta.json`` keeps the run's clocks, every rank's counters and
        the config, so that a resumed run goes on with one history. A run resumed at the
        step of its checkpoint keeps that checkpoint: it holds this very state.
        """
        root = self.checkpoint_dir
        final = root / f"step-{step:08d}"
        tmp = root / f".tmp-step-{step:08d}"
        if self.resumed is not None and self.resumed.step == step:
            return final  # resumed at its last step: that checkpoint holds this very state
        counters = self.gather_objects(self._counters())
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        _torch_save_atomic(rank_state, tmp / f"rank{self.rank}.pt")
        if self.is_main and model is not None:
            _torch_save_atomic(_cpu_state(model), tmp / "model.pt")
        self.barrier()
        if self.is_main:
            meta = {
                "step": step,
                "epoch": epoch,
                "world": self.world,
                "extra": extra or {},
                "time_s": self.elapsed(),
                "fit_s": self.fit_s(),
                "counters": counters,
                "config": self.cfg.to_dict(),
            }
            atomic_write_text(tmp / "meta.json", json.dumps(meta))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            atomic_write_text(root / "latest", final.name)
            for old in root.glob("step-*"):
                if old.name != final.name:
                    shutil.rmtree(old, ignore_errors=True)
        self.barrier()
        return final

    def load_checkpoint(self, run_dir: Path | None = None) -> Checkpoint | None:
        """The latest complete checkpoint of ``run_dir`` (default: this run), or None if none.

        Raises:
            JimuError: the checkpoint is damaged or was written with another worker count.
        """
        found = latest_checkpoint(Path(run_dir or self.out_dir))
        if found is None:
            return None
        folder, meta = found
        if meta["world"] != self.world:
            raise JimuError(
                f"checkpoint {folder} was written by {meta['world']} workers; "
                f"resume with --workers {meta['world']} (workers: {self.world})"
            )
        try:
            model_state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
            rank_state = torch.load(
                folder / f"rank{self.rank}.pt", map_location="cpu", weights_only=True
            )
        except (OSError, ValueError, KeyError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
            raise JimuError(f"checkpoint {folder} is damaged: {e}") from None
        counters = meta.get("counters")
        return Checkpoint(
            meta["step"],
            meta["epoch"],
            model_state,
            rank_state,
            meta.get("extra", {}),
            meta.get("time_s", 0.0),
            meta.get("fit_s", 0.0),
            counters[self.rank] if counters else None,
        )

    def continue_history(self, ckpt: Checkpoint | None, how: str) -> None:
        """Go on with this run folder's history from ``ckpt`` (None: from the start).

        One history per run: rank 0 drops the events logged after the checkpoint's step
        (the work they record is done again) and rewrites ``events.jsonl`` atomically; the
        clocks (``time_s``, the fit time) and this rank's byte and time counters go on from
        the checkpoint's, so events and summary read as one uninterrupted run. The next
        event carries ``resumed``: the step it went on from, how (``--resume`` or the
        elastic restart), and the events dropped.
        """
        self.resumed = ckpt
        step = ckpt.step if ckpt is not None else 0
        if ckpt is not None:
            self._before_s, self._before_fit_s = ckpt.time_s, ckpt.fit_s
            if ckpt.counters is not None:
                for k, v in ckpt.counters["stats"].items():
                    setattr(self.stats, k, v)
                self._last = list(ckpt.counters["last"])
                self._last_kinds = dict(ckpt.counters.get("last_kinds", {}))
                self._train_s, self._eval_s = ckpt.counters["train_s"], ckpt.counters["eval_s"]
        if not self.is_main:
            return
        dropped, torn = 0, None
        if (self.out_dir / "events.jsonl").exists():
            events, torn = read_event_log(self.out_dir)
            kept = [e for e in events if e.get("step", 0) <= step]
            dropped = len(events) - len(kept)
            text = "".join(json.dumps(e) + "\n" for e in kept)
            atomic_write_text(self.out_dir / "events.jsonl", text)
        self._resume_note = {
            "step": step,
            "epoch": ckpt.epoch if ckpt is not None else 0,
            "by": how,
            "events_dropped": dropped,
        }
        where = (
            f"its checkpoint at step {step}" if ckpt is not None else "the start (no checkpoint)"
        )
        cut = " and a last line cut short" if torn else ""
        print(
            f"{how}: {self.out_dir} goes on from {where}; "
            f"{dropped} later event(s){cut} dropped from events.jsonl",
            flush=True,
        )

    def _counters(self) -> dict[str, Any]:
        """This rank's byte and time counters, for a checkpoint."""
        return {
            "stats": asdict(self.stats),
            "last": self._last,
            "last_kinds": self._last_kinds,
            "train_s": self._train_s,
            "eval_s": self._eval_s,
        }


def _cpu_state(model: nn.Module) -> dict[str, Any]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
