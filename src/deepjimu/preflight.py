"""Before the workers start: each worker's predicted memory against the limits that apply,
the run's ``--memory-limit`` groups, and what they held (:mod:`deepjimu.budget`)."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from deepjimu.atomic import atomic_write_text
from deepjimu.budget import ENV as BUDGET_ENV
from deepjimu.budget import (
    MemoryGroups,
    address_limit,
    group_limit,
    job_group,
    memory_groups,
    memory_limit_bytes,
    oom_kills,
)
from deepjimu.config import RunConfig
from deepjimu.cost.profile import Layer
from deepjimu.data import DataSplits
from deepjimu.devices import pick_device
from deepjimu.errors import JimuError
from deepjimu.measure.blocks import layers_of
from deepjimu.memory import Limit, available_memory, check_fit
from deepjimu.models import build_model
from deepjimu.record.folder import latest_checkpoint
from deepjimu.strategies.registry import rank_peaks
from deepjimu.threads import ThreadPlan, scoped_env
from deepjimu.units import format_bytes

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Budget", "budget_groups", "check_machine", "job_budget", "with_budget_peaks"]


def check_machine(
    cfg: RunConfig, plan: ThreadPlan, data: DataSplits, model: nn.Module | None
) -> tuple[int, ...]:
    """Before any worker starts: refuse workers that their memory cannot hold, and say once
    when they outnumber the cores (they run, each slower). Returns each worker's predicted
    figure of what ``--memory-limit`` counts (bytes: its own allocations once started).

    Each worker is charged what its strategy puts on it
    (:func:`~deepjimu.strategies.registry.rank_peaks`: a split model its blocks, fsdp its
    shards), from the model's shapes: the factory's (``model``), else ``cfg.model``'s built
    on the meta device (nothing allocated). The limits are the ones that apply: a worker's
    ``--memory-limit`` or ``RLIMIT_AS``, a GPU's memory, and what the workers share: the
    memory cgroup this process runs in (a Slurm job's) and the machine's available memory.

    Raises:
        OutOfMemory: the workers would not fit (:func:`deepjimu.memory.check_fit`).
    """
    assert cfg.workers is not None
    if cfg.workers > plan.cores:
        print(
            f"warning: {cfg.workers} workers on {plan.cores} core{'s' if plan.cores > 1 else ''} "
            f"take turns on them, each slower than alone; --workers {plan.cores} gives each "
            "worker a core",
            file=sys.stderr,
            flush=True,
        )
    if model is None:
        with torch.device("meta"):
            model = build_model(cfg.model, data.feature_shape, data.num_classes)
    splits = (data.train_x, data.train_y, data.val_x, data.val_y, data.test_x, data.test_y)
    data_bytes = sum(t.numel() * t.element_size() for t in splits)
    device = pick_device(cfg, 0, cfg.workers)
    cuda = device.type == "cuda"
    try:
        layers = layers_of(model, data.train_x[:1], flops=False)  # type: ignore[arg-type]
    except (RuntimeError, TypeError, NotImplementedError):
        # a model whose blocks take more than a batch of features (a graph's): its
        # parameters as one block, held whole by every worker
        params = sum(p.numel() for p in model.parameters())
        layers = [Layer("model", 0.0, params, 0, 0)]
    peaks = rank_peaks(cfg, layers, len(data.train_x), data_bytes, cuda)
    states = rank_peaks(cfg, layers, len(data.train_x), data_bytes, cuda, whole=False)
    limits = []
    budget = memory_limit_bytes(cfg.memory_limit)
    if budget is not None:
        limits.append(Limit(budget, f"its --memory-limit {format_bytes(budget)}", False, True))
    address = address_limit()
    if address is not None:
        limits.append(Limit(address, "RLIMIT_AS (ulimit -v)", shared=False))
    if cuda:
        total = torch.cuda.get_device_properties(device).total_memory
        limits.append(Limit(total, f"the {format_bytes(total)} of {device}", False, True))
    else:
        group = group_limit()
        if group is not None:
            limits.append(Limit(group[0], f"the {format_bytes(group[0])} of {group[1]}", True))
        available = available_memory()
        if available is not None:
            limits.append(Limit(available, f"the {format_bytes(available)} available", True))
    check_fit(peaks, limits, states)
    return tuple(states)


@dataclass(frozen=True)
class Budget:
    """The run's memory groups (``--memory-limit`` on a CPU; None: no groups) and each
    worker's predicted peak (bytes), for the line that names a worker which passed it."""

    groups: MemoryGroups | None = None
    need: tuple[int, ...] = ()
    job: tuple[Path, int] | None = None

    def line(self, workers: int, out_dir: Path, killed: int | None = None) -> str | None:
        """The line for the first worker the kernel's out-of-memory killer ended, read from
        its group's counter; or for worker ``killed`` (ended by SIGKILL) where the memory
        cgroup the run was started in (a Slurm job's: :attr:`job`, its counter before the
        run) counted a kill since; None where neither."""
        rank = None
        if self.groups is not None:
            rank = next((r for r in range(workers) if self.groups.oom_killed(r)), None)
        if rank is None:
            return self._job_line(killed, out_dir)
        assert self.groups is not None
        peak = self.groups.peak(rank)
        predicted = format_bytes(self.need[rank] if rank < len(self.need) else None)
        if rank < len(self.need) and self.need[rank] < max(self.need):
            # a split model is cut at run time by measured block times, the prediction by
            # FLOPs: where two cuts tie, the larger part can land on another worker
            predicted += f" as the prediction cut the model, {format_bytes(max(self.need))} "
            predicted += "for its largest worker"
        return (
            f"worker {rank} passed its memory budget of {format_bytes(self.groups.limit)} "
            f"(--memory-limit) and the kernel's out-of-memory killer ended it (its peak: "
            f"{format_bytes(peak)}; predicted: {predicted}); {_kept(out_dir)}"
        )

    def _job_line(self, killed: int | None, out_dir: Path) -> str | None:
        if killed is None or self.job is None:
            return None
        group, before = self.job
        now = oom_kills(group)
        if now is None or now <= before:
            return None
        limit = group_limit()
        has = f" of {format_bytes(limit[0])}" if limit is not None else ""
        return (
            f"worker {killed} was ended by the kernel's out-of-memory killer: the memory "
            f"cgroup {group}{has}, which the run's workers share, ran out; {_kept(out_dir)}"
        )


def job_budget(groups: MemoryGroups | None, need: tuple[int, ...]) -> Budget:
    """The run's :class:`Budget`, with the memory cgroup it starts in and that group's
    out-of-memory kills so far."""
    group = job_group()
    kills = oom_kills(group) if group is not None else None
    job = (group, kills) if group is not None and kills is not None else None
    return Budget(groups, need, job)


def _kept(out_dir: Path) -> str:
    """What a run stopped for memory kept: its last checkpoint and how to go on, or none."""
    try:
        found = latest_checkpoint(out_dir)
    except JimuError:
        found = None
    if found is None:
        return f"{out_dir} has no checkpoint yet"
    return f"last checkpoint: {found[0]} (go on with more memory: jimu train --resume {out_dir})"


def budget_groups(cfg: RunConfig, held: contextlib.ExitStack) -> MemoryGroups | None:
    """``--memory-limit`` on a CPU: one memory cgroup per worker for the run, which the
    workers find by their environment (on a GPU each worker caps its own allocator)."""
    limit = memory_limit_bytes(cfg.memory_limit)
    assert cfg.workers is not None
    if limit is None or pick_device(cfg, 0, cfg.workers).type == "cuda":
        return None
    groups = held.enter_context(memory_groups(limit, cfg.workers))
    held.enter_context(scoped_env({BUDGET_ENV: str(groups.folder)}))
    return groups


def with_budget_peaks(
    summary: dict[str, Any], groups: MemoryGroups, workers: int, out_dir: Path
) -> dict[str, Any]:
    """The summary with what each worker's memory group held at most (MB: what
    ``--memory-limit`` counts), written back to the run folder."""
    peaks = [groups.peak(r) for r in range(workers)]
    summary = {
        **summary,
        "memory_limit_mb": round(groups.limit / 2**20, 1),
        "budget_peak_mb_per_rank": [None if b is None else round(b / 2**20, 1) for b in peaks],
    }
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
