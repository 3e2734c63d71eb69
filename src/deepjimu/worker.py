"""What each worker process runs: process group, data, model, strategy.fit, summary."""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, load_dataset
from deepjimu.errors import JimuError
from deepjimu.models import build_model
from deepjimu.precision import matmul_precision
from deepjimu.report import best_validation, read_events
from deepjimu.run import Run, atomic_write_text
from deepjimu.strategies import get_strategy
from deepjimu.strategies.base import accuracies

__all__ = ["default_run_name", "error_dir", "free_port", "worker_main"]


def default_run_name(cfg: RunConfig) -> str:
    """``<strategy>-<dataset>-<YYYYmmdd-HHMMSS>``."""
    return f"{cfg.strategy}-{cfg.dataset}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


def error_dir(out_dir: Path) -> Path:
    """Where failing workers leave their error for the launcher to report."""
    return out_dir / ".errors"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def pick_device(cfg: RunConfig, local_rank: int, local_world: int) -> torch.device:
    """CUDA when asked or available with one GPU per local worker; otherwise the CPU.

    Raises:
        JimuError: ``--device cuda`` without enough GPUs.
    """
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.device == "cuda" and n_gpu < local_world:
        raise JimuError(
            f"--device cuda needs one GPU per worker (GPUs: {n_gpu}, workers on this machine: {local_world})"
        )
    if cfg.device == "cpu" or n_gpu < local_world:
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def worker_main(
    cfg_dict: dict[str, Any], out_dir: str | None, report_errors: bool = True
) -> dict[str, Any] | None:
    """Entry point of one worker (rank from the environment). Returns the summary on rank 0.

    With ``report_errors`` a failure is written to ``<out_dir>/.errors/rank<r>.json`` before
    it propagates, so the launcher of several processes can name the worker and its error
    in one line (a run in the launcher's own process just raises).
    """
    cfg = RunConfig.from_dict(cfg_dict)
    rank = _env_int("RANK", 0)
    folder = Path(out_dir) if out_dir else None
    try:
        return _work(cfg, folder)
    except BaseException as e:
        if folder is not None and report_errors:
            record = {
                "rank": rank,
                "time": time.time(),
                "user_error": isinstance(e, JimuError),
                "message": str(e) if isinstance(e, JimuError) else f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(),
            }
            atomic_write_text(error_dir(folder) / f"rank{rank}.json", json.dumps(record))
        raise


def _work(cfg: RunConfig, out_dir: Path | None) -> dict[str, Any] | None:
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // local_world))
    device = pick_device(cfg, local_rank, local_world)
    if world > 1 or get_strategy(cfg.strategy).needs_group:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        # a one-worker run that still needs a group (ddp x1) has no launcher to rendezvous with
        alone = (
            {} if "MASTER_ADDR" in os.environ else {"init_method": f"tcp://127.0.0.1:{free_port()}"}
        )
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=datetime.timedelta(minutes=30), **alone
        )
    try:
        if out_dir is None:  # started by torchrun: rank 0 names the run folder for everyone
            box = [Path(cfg.runs_dir) / (cfg.name or default_run_name(cfg))]
            if world > 1:
                dist.broadcast_object_list(box, src=0)
            out_dir = box[0]
        with matmul_precision(cfg.precision, device):
            return _train(cfg, out_dir, rank, world, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(
    cfg: RunConfig, out_dir: Path, rank: int, world: int, device: torch.device
) -> dict[str, Any] | None:
    strategy_cls = get_strategy(cfg.strategy)
    run = Run(cfg, out_dir, rank, world, device)
    if rank == 0:
        atomic_write_text(out_dir / "config.json", json.dumps(cfg.to_dict(), indent=2))
    if cfg.download and world > 1:  # one download, then everyone reads the files
        if rank == 0:
            load_dataset(cfg.dataset, DataOptions.from_config(cfg))
        run.barrier()
    data = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    if rank == 0 and data.info and not cfg.quiet:
        print(f"{cfg.dataset}: " + ", ".join(f"{k} {v}" for k, v in data.info.items()))
    if strategy_cls.shards_data:
        data = data.shard(rank, world)
    strategy = strategy_cls(cfg)
    data = data.to(strategy.data_device(device))
    model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
    if cfg.resume:
        ckpt = run.load_checkpoint(Path(cfg.resume))
        if ckpt is None:
            raise JimuError(
                f"--resume {cfg.resume}: no checkpoint in {Path(cfg.resume) / 'checkpoint'}"
            )
        model.load_state_dict(ckpt.model_state)
        run.resumed = ckpt
    t0 = time.perf_counter()
    result = strategy.fit(model, data, run)
    fit_s = time.perf_counter() - t0
    totals = run.gather_objects(run.stats.as_list())
    if rank != 0:
        return None
    model = model.to(device)
    events = read_events(out_dir)
    last = events[-1]
    summary: dict[str, Any] = {
        "strategy": cfg.strategy,
        "workers": world,
        "dataset": cfg.dataset,
        "model": cfg.model,
        "epochs": result.epochs,
        "steps": result.steps,
        "seed": cfg.seed,
        "device": str(device),
        "time_s": round(fit_s, 4),
        "loss": last.get("loss"),
        "train_acc": last.get("train_acc"),
    }
    summary |= {"val_acc": None, "test_acc": None}
    summary |= accuracies(model, data, ("val", "test"), device)
    summary |= best_validation(events)
    summary.update(
        {
            "samples_per_s": round(_mean_throughput(events), 3),
            "bytes_sent": int(sum(t[0] for t in totals)),
            "bytes_recv": int(sum(t[1] for t in totals)),
            "compute_s_per_rank": [round(t[2], 4) for t in totals],
            "wait_s_per_rank": [round(t[3], 4) for t in totals],
            "peak_mem_mb_per_rank": last.get("peak_mem_mb_per_rank"),
            **({"data_info": data.info} if data.info else {}),
            **result.extra,
        }
    )
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def _mean_throughput(events: list[dict[str, Any]]) -> float:
    """Training samples per second over the whole run: total samples / total training time."""
    events = [e for e in events if e.get("samples_per_s")]
    samples = sum(e["samples_per_s"] * e["train_s"] for e in events if e.get("train_s"))
    seconds = sum(e["train_s"] for e in events if e.get("train_s"))
    return samples / seconds if seconds else 0.0
