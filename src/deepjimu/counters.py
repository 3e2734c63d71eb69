"""A rank's counters and clocks: bytes and waits (Comm), training and evaluation time, run and fit time."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from deepjimu.comm import Comm, CommStats

__all__ = ["Counters", "Interval"]


@dataclass(frozen=True)
class Interval:
    """What one rank did between two events, and its clocks at the end of it.

    ``delta`` holds the bytes sent, bytes received, compute and wait seconds (the order of
    :meth:`CommStats.as_list`), ``kinds`` the bytes sent per labelled kind, ``train_s`` the
    time in :meth:`Counters.training` blocks and ``samples`` the training samples of the
    interval; ``clocks`` the readings of :data:`~deepjimu.clocks.CLOCKS` and ``samples_total`` the samples
    trained on since the run began.
    """

    delta: list[float]
    kinds: dict[str, int]
    train_s: float
    samples: int
    clocks: dict[str, float]
    samples_total: int


class Counters:
    """The byte counter, timers and clocks of one rank; events read them by interval.

    ``comm`` counts every message a strategy sends (``stats`` holds the totals);
    :meth:`training` and :meth:`evaluation` time blocks of work (they do not nest, so the
    two clocks never count the same second); :meth:`interval` hands what happened since the
    last call to the event log; :meth:`state` and :meth:`go_on` carry all of it across a
    checkpoint, so a resumed run counts on from where it stopped.

    Args:
        device: where this rank computes (timers wait for its queued work).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stats = CommStats()
        self.comm = Comm(self.stats)
        self.train_s = 0.0  # clocks since the run began
        self.eval_s = 0.0
        self.samples = 0  # training samples since the run began
        self._t0 = time.perf_counter()
        self._fit_t0: float | None = None
        self._before_s = self._before_fit_s = 0.0  # the clocks of the history this run continues
        self._block: str | None = None  # the timed block under way
        self._aside_s = 0.0  # the time set aside (:meth:`aside`) in the training block under way
        self._last = [0.0, 0.0, 0.0, 0.0]
        self._last_kinds: dict[str, int] = {}
        self._last_train_s = 0.0
        self._last_samples = 0

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the run started on this rank (a resumed run goes on from its
        checkpoint's), at ``now`` (a ``time.perf_counter`` reading; default: now)."""
        return self._before_s + (time.perf_counter() if now is None else now) - self._t0

    def begin_fit(self) -> None:
        """Start the fit clock (:meth:`fit_s`): called just before ``Strategy.fit``."""
        self._fit_t0 = time.perf_counter()

    def fit_s(self, now: float | None = None) -> float:
        """Seconds spent in ``Strategy.fit`` over the whole run, resumed segments included,
        at ``now`` (as :meth:`elapsed`'s)."""
        if self._fit_t0 is None:
            return self._before_fit_s
        return self._before_fit_s + (time.perf_counter() if now is None else now) - self._fit_t0

    def clocks(self) -> dict[str, float]:
        """The readings of :data:`~deepjimu.clocks.CLOCKS` now, from one reading of the timer
        (two would put fit_s above time_s where the fit began within microseconds of the run)."""
        now = time.perf_counter()
        return {
            "time_s": self.elapsed(now),
            "fit_s": self.fit_s(now),
            "train_s": self.train_s,
            "eval_s": self.eval_s,
        }

    def synchronize(self) -> None:
        """Wait for queued device work, so that host timers measure it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def _timed(self, block: str) -> Iterator[None]:
        if self._block is not None:  # a strategy's mistake: one second would count twice
            raise RuntimeError(f"a {block} block inside a {self._block} block: timers do not nest")
        self._block = block
        try:
            yield
        finally:
            self._block = None

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """Time a block as training: its wall time is training time (``train_s``), of which
        the time blocked on messages counted by Comm is wait and the rest compute."""
        wait0 = self.stats.wait_s
        t0 = time.perf_counter()
        self._aside_s = 0.0
        with self._timed("training"):
            try:
                yield
            finally:
                self.synchronize()
                wall = time.perf_counter() - t0 - self._aside_s
                self.train_s += wall
                self.eval_s += self._aside_s
                self.stats.compute_s += wall - (self.stats.wait_s - wait0)

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Time bookkeeping inside a training block as evaluation: what measures an iterate
        while the iteration still holds its operands (admm's objective, from each layer's
        a = p W^T + b as its step computes it) leaves ``train_s`` for ``eval_s``. Outside any
        block, an evaluation block; inside one of evaluation, part of it."""
        if self._block == "evaluation":
            yield
            return
        if self._block is None:
            with self.evaluation():
                yield
            return
        self.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.synchronize()
            self._aside_s += time.perf_counter() - t0

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Time a block as evaluation (``eval_s``), kept apart from training time.

        Time-to-accuracy counts training time only, so a strategy that evaluates more
        often is not penalised.
        """
        t0 = time.perf_counter()
        with self._timed("evaluation"):
            try:
                yield
            finally:
                self.synchronize()
                self.eval_s += time.perf_counter() - t0

    def interval(self, samples: int = 0) -> Interval:
        """What happened since the last call (or the start), ``samples`` training samples
        included, and start the next interval."""
        self.samples += samples
        current = self.stats.as_list()
        delta = [c - p for c, p in zip(current, self._last, strict=True)]
        kinds = dict(self.stats.sent_by_kind)
        kinds_delta = {k: n - self._last_kinds.get(k, 0) for k, n in kinds.items()}
        out = Interval(
            delta,
            kinds_delta,
            self.train_s - self._last_train_s,
            self.samples - self._last_samples,
            self.clocks(),
            self.samples,
        )
        self._last, self._last_kinds = current, kinds
        self._last_train_s, self._last_samples = self.train_s, self.samples
        return out

    def state(self) -> dict[str, Any]:
        """The counters as plain values, for a checkpoint (the run's clocks travel apart: rank 0's)."""
        return {
            "stats": asdict(self.stats),
            "last": self._last,
            "last_kinds": self._last_kinds,
            "train_s": self.train_s,
            "eval_s": self.eval_s,
            "samples": self.samples,
            "last_train_s": self._last_train_s,
            "last_samples": self._last_samples,
        }

    def go_on(self, state: dict[str, Any] | None, time_s: float, fit_s: float) -> None:
        """Continue from a checkpoint: its clocks, and this rank's counters if it has them."""
        self._before_s, self._before_fit_s = time_s, fit_s
        if state is None:
            return
        for k, v in state["stats"].items():
            setattr(self.stats, k, v)
        self._last = list(state["last"])
        self._last_kinds = dict(state.get("last_kinds", {}))
        self.train_s, self.eval_s = state["train_s"], state["eval_s"]
        self.samples = state.get("samples", 0)
        self._last_train_s = state.get("last_train_s", 0.0)
        self._last_samples = state.get("last_samples", 0)
