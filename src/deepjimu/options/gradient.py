"""The options of the gradient strategies: the optimiser, K-FAC, the pipeline's schedule, ddp's gradient sync.

Each group applies to the strategies that take it (their registry entries' ``options``).
No torch import here: ``--help`` is built before torch loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from deepjimu.applies import Applies, Condition, Takers
from deepjimu.choices import KfacMethod, LrSchedule, Optimizer, Schedule
from deepjimu.options.base import Group, checker, choice_problems, minimums, option
from deepjimu.options.compress import compress_problems

__all__ = ["KfacGroup", "OptimGroup", "PipelineGroup", "SyncGroup"]

_KFAC = Applies(
    when=Condition("--optimizer kfac", lambda c: c.optimizer == Optimizer.KFAC, ("optimizer",)),
)
_COSINE = Applies(
    when=Condition(
        "--lr-schedule cosine", lambda c: c.lr_schedule == LrSchedule.COSINE, ("lr_schedule",)
    ),
)


def _ddp_compress(*kinds: str) -> Applies:
    """ddp with one of these compressors (``auto`` may pick any of them)."""
    names = (*kinds, "auto")
    text = f"{', '.join(names[:-1])} or {names[-1]}"
    return Applies(
        when=Condition(
            f"--compress {text}", lambda c: c.compress.split(":")[0] in names, ("compress",)
        ),
    )


@dataclass(frozen=True)
class KfacGroup(Group):
    """K-FAC's options (issue 12): ``--optimizer kfac``, K-FAC-preconditioned SGD with momentum (KAISA)."""

    table: ClassVar[str] = "kfac"
    title: ClassVar[str] = "K-FAC (--optimizer kfac)"

    kfac_factor_every: int = option(
        1, "steps between factor updates (A, G all-reduced)", applies=_KFAC
    )
    kfac_inv_every: int = option(10, "steps between decompositions of the factors", applies=_KFAC)
    kfac_damping: float = option(0.1, "damping gamma added to each factor", applies=_KFAC)
    kfac_kl_clip: float = option(
        0.001, "bound on the step's KL estimate (0: no clipping)", applies=_KFAC
    )
    kfac_factor_decay: float = option(
        0.95, "running-average weight of the old factors", applies=_KFAC
    )
    kfac_grad_workers: float = option(
        1.0,
        "fraction F of workers preconditioning each layer, 1/workers (MEM-OPT) to 1 (COMM-OPT)",
        applies=_KFAC,
    )
    kfac_method: KfacMethod = option(
        KfacMethod.EIGEN, "eigen decompositions or damped inverses", applies=_KFAC
    )

    def problems(self) -> list[str]:
        problems, need = checker()
        problems += minimums(self, {"kfac_factor_every": 1, "kfac_inv_every": 1})
        need(
            math.isfinite(self.kfac_damping) and self.kfac_damping > 0,
            f"kfac-damping must be a positive number (kfac-damping: {self.kfac_damping})",
        )
        need(
            math.isfinite(self.kfac_kl_clip) and self.kfac_kl_clip >= 0,
            f"kfac-kl-clip must be >= 0 (kfac-kl-clip: {self.kfac_kl_clip})",
        )
        need(
            0 <= self.kfac_factor_decay < 1,
            f"kfac-factor-decay must be in [0, 1) (kfac-factor-decay: {self.kfac_factor_decay})",
        )
        return [*problems, *choice_problems(self, KfacGroup)]


@dataclass(frozen=True)
class OptimGroup(Group):
    """The gradient strategies' optimiser: batch size, optimizer, learning rate, momentum, decay.

    ``None`` means "the optimizer's default" for ``lr`` (:data:`deepjimu.defaults.DEFAULT_LR`).
    """

    table: ClassVar[str] = "optim"
    title: ClassVar[str] = "optimiser (gradient strategies)"

    batch_size: int = option(64, "global mini-batch size (split over data-parallel workers)")
    optimizer: Optimizer = option(
        Optimizer.ADAM,
        "optimizer of gradient strategies",
        applies=Applies(values=(("kfac", Applies(strategies=Takers(group=KfacGroup))),)),
    )
    lr: float | None = option(None, "learning rate", default_text="1e-3 adam, 0.05 sgd and kfac")
    momentum: float = option(
        0.9,
        "SGD momentum",
        applies=Applies(
            when=Condition(
                "--optimizer sgd or kfac",
                lambda c: c.optimizer in (Optimizer.SGD, Optimizer.KFAC),
                ("optimizer",),
            ),
        ),
    )
    weight_decay: float = option(0.0, "L2 weight decay")
    lr_schedule: LrSchedule = option(
        LrSchedule.CONSTANT,
        "learning rate over the run: constant, or cosine (linear warm-up over --warmup-steps, "
        "then cosine decay to --min-lr at the run's last step, as nanoGPT's)",
    )
    warmup_steps: int = option(0, "steps of linear warm-up from 0 to --lr", applies=_COSINE)
    min_lr: float | None = option(
        None, "the rate the cosine decay ends at", default_text="--lr / 10", applies=_COSINE
    )
    steps: int | None = option(
        None,
        "the run's length in optimizer steps, as language models count it, instead of "
        "--epochs (the last epoch stops part way)",
        default_text="--epochs decides",
    )

    def problems(self) -> list[str]:
        problems, need = checker()
        problems += minimums(self, {"batch_size": 1, "steps": 1})
        need(
            self.lr is None or (math.isfinite(self.lr) and self.lr > 0),
            f"lr must be a positive number (lr: {self.lr})",
        )
        need(0 <= self.momentum < 1, f"momentum must be in [0, 1) (momentum: {self.momentum})")
        problems += minimums(self, {"warmup_steps": 0})
        need(
            self.min_lr is None
            or (self.min_lr >= 0 and (self.lr is None or self.min_lr <= self.lr)),
            f"min-lr must be in [0, lr] (min-lr: {self.min_lr}, lr: {self.lr})",
        )
        problems += minimums(self, {"weight_decay": 0})
        return [*problems, *choice_problems(self, OptimGroup)]


@dataclass(frozen=True)
class PipelineGroup(Group):
    """The pipeline's schedule and micro-batches."""

    table: ClassVar[str] = "pipeline"
    title: ClassVar[str] = "pipeline"

    schedule: Schedule = option(Schedule.GPIPE, "pipeline schedule")
    microbatches: int = option(4, "micro-batches per mini-batch")

    def problems(self) -> list[str]:
        return [*minimums(self, {"microbatches": 1}), *choice_problems(self, PipelineGroup)]


@dataclass(frozen=True)
class SyncGroup(Group):
    """ddp's gradient synchronisation: compression, local SGD, per-tensor sync plans (deepjimu.compress)."""

    table: ClassVar[str] = "sync"
    title: ClassVar[str] = "ddp gradient sync"

    compress: str = option(
        "none",
        "gradient compression: none, fp16, bf16, powersgd[:RANK], topk[:RATIO], "
        "qsgd[:BITS], or auto (probe the link, let the cost model pick)",
    )
    compress_start: int | None = option(
        None,
        "plain all-reduce steps before powersgd, topk or qsgd start",
        default_text="a tenth of the run's steps, at least 2",
        applies=_ddp_compress("powersgd", "topk", "qsgd"),
    )
    error_feedback: bool = option(
        True,
        "add what compression left out to the next step's gradient",
        applies=_ddp_compress("powersgd", "topk"),
    )
    warm_start: bool = option(
        True,
        "start each step from the last step's P and Q",
        applies=_ddp_compress("powersgd"),
    )
    sync_plan: str = option(
        "allreduce",
        "per-tensor gradient synchronisation: allreduce (DDP's buckets), ps (sharded parameter "
        "server: reduce-scatter, all-gather), sfb (Linear weights as sufficient factors), "
        "sparse (sparse embedding gradients as their touched rows), or auto (per tensor the "
        "method the cost model predicts fastest, from a probe of the link, kept only if it "
        "beats DDP stepped beside it); the tensors a method cannot take are all-reduced",
        choices=("allreduce", "ps", "sfb", "sparse", "auto"),
    )
    local_sgd: int = option(
        0,
        "local SGD, average the models every H steps instead of the gradients (0: off)",
    )
    local_sgd_warmup: int | None = option(
        None,
        "plain all-reduce steps first",
        default_text="a tenth of the run's steps",
        applies=Applies(
            when=Condition("--local-sgd > 0", lambda c: c.local_sgd > 0, ("local_sgd",)),
        ),
    )

    def problems(self) -> list[str]:
        problems, need = checker()
        problems.extend(compress_problems(self.compress))
        start = self.compress_start
        problems += minimums(self, {"compress_start": 0})
        need(
            start is None
            or start >= 2
            or not (self.error_feedback or self.warm_start)
            or not self.compress.startswith(("powersgd", "auto")),
            "compress-start must be >= 2 for powersgd with error feedback or warm start: DDP "
            f"rebuilds its buckets after step 1 (compress-start: {start}, compress: {self.compress})",
        )
        problems += minimums(self, {"local_sgd": 0, "local_sgd_warmup": 0})
        need(
            not (self.local_sgd and self.compress != "none"),
            "local-sgd and compress cannot be combined "
            f"(local-sgd: {self.local_sgd}, compress: {self.compress})",
        )
        return [*problems, *choice_problems(self, SyncGroup)]
