"""What every predictor shares: the prediction record, the ranks' threads, speeds and shares of work, an epoch's batches."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from deepjimu.balance import chosen_balance, shard_sizes
from deepjimu.config import RunConfig
from deepjimu.cost.cluster import Cluster

__all__ = [
    "FLOAT",
    "Prediction",
    "balanced_speeds",
    "column",
    "cut_after",
    "epoch_batches",
    "row_shares",
    "slowdown",
    "stage_starts",
    "stages_of",
    "threads_per_rank",
    "workers_of",
]

FLOAT = 4  # activations, gradients and admm's variables are float32


@dataclass(frozen=True)
class Prediction:
    """One configuration's predicted figures.

    ``step_s``: one training step (admm: one iteration, its share of the readout
    included); ``samples_per_s``: training samples over training time, as ``jimu bench``;
    ``bytes_per_sample``: bytes sent by all ranks per training sample; ``peak_mem_mb``: the
    largest rank's predicted peak memory (``registry.rank_peaks``: its training state, and
    on a CPU the process's base and data; filled in by ``registry.predict``); ``parts``: the step's components.
    """

    strategy: str
    workers: int
    step_s: float
    samples_per_s: float
    bytes_per_sample: float
    peak_mem_mb: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """The ``predicted`` record of ``plan.json``."""
        return {
            "step_s": self.step_s,
            "samples_per_s": self.samples_per_s,
            "bytes_per_sample": self.bytes_per_sample,
            "peak_mem_mb": self.peak_mem_mb,
            "parts": self.parts,
        }


def workers_of(cfg: RunConfig) -> int:
    """The run's worker count (a validated config has one)."""
    assert cfg.workers is not None, "config not resolved"
    return cfg.workers


def stages_of(cfg: RunConfig) -> int:
    """The ranks of one replica (``--replicas R``: workers / R; the workers without)."""
    return workers_of(cfg) // cfg.replicas


def column(cfg: RunConfig, stage: int) -> list[int]:
    """The ranks that hold ``stage`` of a split model, one per replica (``--replicas``:
    rank r K + stage of replica r, :mod:`deepjimu.mesh`'s layout)."""
    k = stages_of(cfg)
    return [r * k + stage for r in range(cfg.replicas)]


def threads_per_rank(cluster: Cluster, p: int) -> int:
    """Threads of each of ``p`` ranks (:meth:`Cluster.threads_per_rank`; 1 on a GPU cluster)."""
    return cluster.threads_per_rank(p) or 1


def slowdown(cluster: Cluster, p: int, busy: float | None = None) -> float:
    """How much slower each of ``p`` ranks computes when they run at once
    (:meth:`Cluster.ranks_sharing_cores`); where only ``busy`` of them compute at a time on
    average (a pipeline's bubbles), the slowdown in proportion."""
    full = cluster.ranks_sharing_cores(p)
    if busy is None:
        return full
    return 1.0 + (full - 1.0) * min(1.0, busy / p)


def balanced_speeds(
    cfg: RunConfig, cluster: Cluster, p: int | None = None
) -> tuple[list[float], bool]:
    """The speeds of the ``p`` ranks that split the run's work (:meth:`Cluster.rank_speeds`;
    default: one replica's, whose chain a split model is cut over) and whether the run
    balances its work by them (``--balance`` resolved as the workers resolve it,
    :func:`deepjimu.balance.chosen_balance`)."""
    speeds = cluster.rank_speeds(stages_of(cfg) if p is None else p)
    return speeds, chosen_balance(str(cfg.balance), speeds) == "speed"


def row_shares(rows: int, speeds: list[float], by_speed: bool) -> list[int]:
    """Each rank's rows of a batch of ``rows``: in proportion to its speed (as the workers
    shard by it, :func:`~deepjimu.data.base.shard_sizes`), or an equal share."""
    return shard_sizes(rows, speeds) if by_speed else [math.ceil(rows / len(speeds))] * len(speeds)


def epoch_batches(train_size: int, batch: int) -> list[tuple[int, int]]:
    """(rows, count) of an epoch's batches: ceil(N / batch) nearly equal ones, as the
    strategies cut an epoch (``strategies.base.split_steps``)."""
    steps = math.ceil(train_size / batch)
    small, extra = divmod(train_size, steps)
    return [(small + 1, extra)] * bool(extra) + [(small, steps - extra)]


def cut_after(sizes: list[int]) -> list[int]:
    """The block after which each stage ends (but the last)."""
    out, at = [], 0
    for s in sizes[:-1]:
        at += s
        out.append(at - 1)
    return out


def stage_starts(sizes: list[int]) -> list[tuple[int, int]]:
    out, at = [], 0
    for s in sizes:
        out.append((at, s))
        at += s
    return out
