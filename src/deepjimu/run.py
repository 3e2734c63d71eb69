"""Run: what every strategy gets besides the model and data, one facade over the run's parts."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor, nn

from deepjimu.balance import chosen_balance
from deepjimu.bookkeeping import Bookkeeping
from deepjimu.comm import Comm
from deepjimu.config import RunConfig
from deepjimu.cost.probe import Probe
from deepjimu.cost.sync import SyncPlan, SyncTrial
from deepjimu.counters import Counters
from deepjimu.data import DataSplits
from deepjimu.mesh import Mesh, device_mesh
from deepjimu.options import DdpOptions
from deepjimu.precision import autocast
from deepjimu.record.checkpoint import Checkpoint, Checkpointer
from deepjimu.record.events import EventLog

if TYPE_CHECKING:  # the executor's module loads torch.distributed: only ddp's runs need it
    from torch.distributed.device_mesh import DeviceMesh

    from deepjimu.compress.sync import SyncExecutor

__all__ = ["Measurer", "Run"]


class Measurer(Protocol):
    """What a strategy may need measured, handed to it through its :class:`Run` (the worker
    makes it: :class:`deepjimu.measure.measurer.ThisMachine`), so that no strategy imports
    the measuring layer above it. Each method is called by every rank at the same point."""

    def probe(self, model: nn.Sequential, data: DataSplits, cfg: DdpOptions, run: Run) -> Probe:
        """Collective: the link and this device for ``model`` (``--compress auto``)."""
        ...

    def sync_plan(
        self,
        model: nn.Module,
        batches: Sequence[tuple[Tensor, Tensor]],
        rows: int,
        plan: str,
        run: Run,
    ) -> SyncPlan:
        """Collective: ddp's ``--sync-plan`` ``plan`` of ``model``, the same on every rank."""
        ...

    def sync_trial(
        self,
        model: nn.Module,
        ddp: nn.Module,
        executor: SyncExecutor,
        batches: Sequence[tuple[Tensor, Tensor]],
        run: Run,
    ) -> SyncTrial:
        """Collective: ``executor``'s plan and torch's DDP stepped alternately on ``batches``
        (``--sync-plan auto`` held to the default)."""
        ...

    def block_costs(self, model: nn.Sequential, sample: Tensor, repeats: int = 3) -> list[float]:
        """Each block's forward + backward seconds on ``sample`` (``--balance time``)."""
        ...


class Run:
    """Context of one training run on one rank.

    Holds the rank/world/device and delegates to the run's parts: the byte counter,
    timers and clocks (:class:`~deepjimu.counters.Counters`, as ``counters``), the event
    log with its progress bar (:class:`~deepjimu.record.events.EventLog`, as ``events``; written by
    rank 0 only), checkpoints (:class:`~deepjimu.record.checkpoint.Checkpointer`, as
    ``checkpoints``) and the bookkeeping collectives
    (:class:`~deepjimu.bookkeeping.Bookkeeping`). Methods marked *collective* must be called
    by every rank at the same point.

    Args:
        cfg: the validated config.
        out_dir: the run folder (``runs/<name>``); every rank knows it, rank 0 writes it.
        rank, world: this process in the default process group (0, 1 without one).
        device: where this rank computes.
        measurer: what measures this machine for the strategy (:class:`Measurer`; the
            worker's is :class:`deepjimu.measure.measurer.ThisMachine`); None: a run that
            needs nothing measured.
    """

    def __init__(
        self,
        cfg: RunConfig,
        out_dir: Path,
        rank: int = 0,
        world: int = 1,
        device: torch.device | None = None,
        measurer: Measurer | None = None,
    ) -> None:
        self.cfg = cfg
        self._measurer = measurer
        self.out_dir = Path(out_dir)
        self.rank, self.world = rank, world
        self.device = device or torch.device("cpu")
        self.is_main = rank == 0
        self.bookkeeping = Bookkeeping(world)
        self.counters = Counters(self.device)
        self.stats, self.comm = self.counters.stats, self.counters.comm
        self.events = EventLog(
            self.out_dir, self.is_main, cfg.quiet, self.counters, self.bookkeeping
        )
        self.checkpoints = Checkpointer(
            cfg, self.out_dir, rank, world, self.counters, self.events, self.bookkeeping
        )
        # the work split the ranks agreed on (deepjimu.measure.speeds): --balance once resolved
        # ("auto" becomes "speed" or "even") and, balancing by speed, each rank's speed
        self.balance: str = chosen_balance(cfg.balance, None)
        self.speeds: list[float] | None = None
        # the run folder this run goes on from (--resume, a restart), known before the
        # strategy plans: a split measured anew could differ from the checkpoint's
        self.resumed_from: Path | None = None
        # --replicas R: where this rank sits in the R x K mesh, the comm of its stage's
        # column (None in a 1-D run) and its chain's view of the run (made by chain())
        self.mesh: Mesh | None = None
        self.device_mesh: DeviceMesh | None = None  # torch's, of the same R x K ranks
        self.replicas: Comm | None = None
        self._chain: Run | None = None
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)

    @property
    def measurer(self) -> Measurer:
        """What measures this machine for the strategy (``--compress auto``, ``--sync-plan``,
        ``--balance time``)."""
        assert self._measurer is not None, "this Run was made without a measurer"
        return self._measurer

    def chain(self) -> Run:
        """Collective the first time: the run as this rank's replica sees it (``--replicas R``).

        Its ``rank`` and ``world`` are this rank's stage and the stages K of a replica, its
        ``comm`` talks to the ranks of the replica (group ranks 0 .. K-1), so a strategy that
        splits the model runs its 1-D split on it unchanged; ``replicas`` counts, on the same
        counters, the messages among the R ranks that hold the same stage (the column). The
        event log, checkpoints and bookkeeping collectives stay the whole world's. A run of
        one replica is its own chain. Its ``speeds`` (where the run balances by speed) are
        its stages': each the slowest of its column, whose ranks meet at every pooled sum.
        """
        replicas = self.cfg.replicas
        if replicas == 1 or self.world == 1:
            return self
        if self._chain is None:
            self.mesh = Mesh(replicas, self.world // replicas, self.rank)
            self.device_mesh = device_mesh(self.mesh, self.device)
            self.replicas = Comm(self.stats, self.device_mesh.get_group("replica"))
            view = copy.copy(self)
            view.rank, view.world = self.mesh.stage, self.mesh.stages
            if self.speeds is not None:
                K = self.mesh.stages
                view.speeds = [min(self.speeds[k::K]) for k in range(K)]
            view.comm = Comm(self.stats, self.device_mesh.get_group("stage"))
            self._chain = view._chain = view
        return self._chain

    # ---- counters and clocks ----------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since the run started on this rank (a resumed run goes on from its checkpoint's)."""
        return self.counters.elapsed()

    def begin_fit(self) -> None:
        """Start the fit clock (:meth:`fit_s`): called just before ``Strategy.fit``."""
        self.counters.begin_fit()

    def fit_s(self) -> float:
        """Seconds spent in ``Strategy.fit`` over the whole run, resumed segments included."""
        return self.counters.fit_s()

    def synchronize(self) -> None:
        """Wait for queued device work, so that host timers measure it."""
        self.counters.synchronize()

    def training(self) -> contextlib.AbstractContextManager[None]:
        """Time a block as training (:meth:`Counters.training`)."""
        return self.counters.training()

    def evaluation(self) -> contextlib.AbstractContextManager[None]:
        """Time a block as evaluation, apart from training (:meth:`Counters.evaluation`)."""
        return self.counters.evaluation()

    def aside(self) -> contextlib.AbstractContextManager[None]:
        """Time bookkeeping inside a training block as evaluation (:meth:`Counters.aside`)."""
        return self.counters.aside()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for training compute in the run's ``--precision`` (bf16: torch.autocast)."""
        return autocast(self.cfg.precision, self.device)

    # ---- bookkeeping collectives (not counted as training traffic) -------------------------
    def barrier(self) -> None:
        """Collective: wait for every rank."""
        self.bookkeeping.barrier()

    def gather_objects(self, obj: Any) -> list[Any]:
        """Collective: every rank's ``obj``, in rank order, on every rank."""
        return self.bookkeeping.gather_objects(obj)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Collective: ``obj`` of rank ``src`` on every rank."""
        return self.bookkeeping.broadcast_object(obj, src)

    # ---- events -------------------------------------------------------------------------------
    def progress(self, total: int, desc: str) -> None:
        """Start a progress bar on rank 0 (unless ``--quiet``) with ``total`` steps."""
        self.events.progress(total, desc)

    def progress_at(self, n: int) -> None:
        """Move the progress bar to ``n`` (after a resume)."""
        self.events.progress_at(n)

    def log(self, step: int, epoch: int, samples: int = 0, **metrics: Any) -> dict[str, Any]:
        """Collective: write one event with ``metrics`` merged over ranks (:meth:`EventLog.log`)."""
        return self.events.log(step, epoch, samples, **metrics)

    def close(self) -> None:
        """Close the progress bar."""
        self.events.close()

    # ---- checkpoints --------------------------------------------------------------------------
    @property
    def resumed(self) -> Checkpoint | None:
        """The checkpoint this run went on from, or None."""
        return self.checkpoints.resumed

    def last_checkpoint_text(self) -> str:
        """Where the latest checkpoint is, or "none" (for error messages)."""
        return self.checkpoints.last_text()

    def save_checkpoint(
        self,
        step: int,
        epoch: int,
        model: nn.Module | None,
        rank_state: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Collective: write a checkpoint atomically (:meth:`Checkpointer.save`)."""
        return self.checkpoints.save(step, epoch, model, rank_state, extra)

    def load_checkpoint(self, run_dir: Path | None = None) -> Checkpoint | None:
        """Collective: the latest checkpoint of ``run_dir`` or this run (:meth:`Checkpointer.load`)."""
        return self.checkpoints.load(run_dir)

    def continue_history(self, ckpt: Checkpoint | None, how: str) -> None:
        """Go on with this run folder's history from ``ckpt`` (:meth:`Checkpointer.continue_history`)."""
        self.checkpoints.continue_history(ckpt, how)
