"""A finished run's ``summary.json``: rank 0's figures of the whole run, the same keys for every strategy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from deepjimu.atomic import atomic_write_text
from deepjimu.clocks import CLOCKS
from deepjimu.comm import sum_by_kind
from deepjimu.config import RunConfig
from deepjimu.data import DataSplits
from deepjimu.emulate import parse_speeds
from deepjimu.record.read import best_validation, read_events
from deepjimu.run import Run
from deepjimu.strategies.base import FitResult, accuracies
from deepjimu.threads import ThreadPlan, speed_env

__all__ = ["summarise"]


def summarise(
    cfg: RunConfig,
    out_dir: Path,
    world: int,
    device: torch.device,
    plan: ThreadPlan,
    run: Run,
    model: nn.Module,
    data: DataSplits,
    result: FitResult,
    gathered: list[Any],
) -> dict[str, Any]:
    """Rank 0's summary of the finished run (``gathered``: every rank's traffic and time
    counters), written to ``summary.json``."""
    totals = [g[0] for g in gathered]
    events = read_events(out_dir)
    last = events[-1]
    summary: dict[str, Any] = {
        "strategy": cfg.strategy,
        "workers": world,
        **({"replicas": cfg.replicas} if cfg.replicas > 1 else {}),
        "dataset": cfg.dataset,
        "model": cfg.model,
        "epochs": result.epochs,
        "steps": result.steps,
        "seed": cfg.seed,
        "device": str(device),
        **{k: last[k] for k in CLOCKS},  # the run's clocks at its last event
        "loss": last.get("loss"),
        "train_acc": last.get("train_acc"),
    }
    summary |= {"val_acc": None, "test_acc": None}
    if any(t.is_meta for t in model.state_dict().values()):
        # a split model: rank 0 holds its own blocks only; the last event, at the end of
        # training, evaluated the trained model by stages
        summary |= {k: last[k] for k in ("val_acc", "test_acc", "val_loss") if k in last}
    else:
        summary |= accuracies(model.to(device), data, ("val", "test"), device)
    summary |= best_validation(events)
    summary.update(
        {
            "samples": last["samples"],
            "samples_per_s": round(last["samples"] / last["train_s"], 3)
            if last["train_s"]
            else 0.0,
            "bytes_sent": int(sum(t[0] for t in totals)),
            "bytes_recv": int(sum(t[1] for t in totals)),
            "bytes_sent_by_kind": sum_by_kind([g[1] for g in gathered]),
            "compute_s_per_rank": [round(t[2], 4) for t in totals],
            "wait_s_per_rank": [round(t[3], 4) for t in totals],
            "peak_mem_mb_per_rank": last.get("peak_mem_mb_per_rank"),
            "threads": {**plan.record(), "env": speed_env()},
            "balance": run.balance,
            **({"speeds": run.speeds} if run.speeds is not None else {}),
            **({"emulated_speeds": parse_speeds(cfg.emulate_speeds)} if cfg.emulate_speeds else {}),
            **({"data_info": data.info} if data.info else {}),
            **result.extra,
        }
    )
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
