"""Start a run: in this process, as N local workers under torch's elastic launcher, or inside torchrun."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

from deepjimu.config import RunConfig, validate
from deepjimu.data import DataOptions, load_dataset
from deepjimu.errors import JimuError
from deepjimu.precision import check_precision
from deepjimu.run import atomic_write_text
from deepjimu.worker import default_run_name, error_dir, pick_device, worker_main

__all__ = ["probe", "train", "under_torchrun"]


def under_torchrun() -> bool:
    """True when torchrun (or another launcher that sets RANK / WORLD_SIZE) started us."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def train(cfg: RunConfig) -> dict[str, Any] | None:
    """Validate ``cfg``, start its workers, wait, and return rank 0's summary.

    Locally, ``cfg.workers`` processes are started with
    :func:`torch.distributed.launcher.api.elastic_launch` (one process runs in place);
    under torchrun this process is one of the workers and joins its group.

    Raises:
        ConfigErrors: bad config (before any worker starts).
        JimuError: bad data files, or a worker failed (its rank and error in one line).
    """
    return _start(cfg, "train")


def probe(cfg: RunConfig) -> dict[str, Any] | None:
    """``jimu probe``: start ``cfg``'s workers as :func:`train` does, but to probe, not train.

    The workers time the group's collectives and a ddp step of ``cfg``'s model with each
    compressor (:mod:`deepjimu.compress.probe`); rank 0 writes ``<run folder>/probe.json``
    with the cost model's predictions and returns ``{"probe", "choice", "text"}``. The
    strategy is always ``ddp``, the one the probe is for.

    Raises:
        ConfigErrors, JimuError: as :func:`train`.
    """
    return _start(dataclasses.replace(cfg, strategy="ddp"), "probe")


def _start(cfg: RunConfig, job: str) -> dict[str, Any] | None:
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if cfg.workers is not None and cfg.workers != world:
            raise JimuError(f"--workers {cfg.workers} disagrees with torchrun's WORLD_SIZE {world}")
        cfg = validate(dataclasses.replace(cfg, workers=world))
        return worker_main(cfg.to_dict(), None, job=job)
    cfg = validate(cfg)
    assert cfg.workers is not None
    # the device the workers will pick, so that --device cuda without GPUs or --precision
    # tf32 on a CPU fail here, before the run folder exists
    check_precision(cfg.precision, pick_device(cfg, 0, cfg.workers))
    # read (and download) the data once here, so bad files fail before any worker starts
    load_dataset(cfg.dataset, DataOptions.from_config(cfg))
    out_dir = _prepare_run_dir(cfg)
    cfg_dict = {**cfg.to_dict(), "download": False}
    shutil.rmtree(error_dir(out_dir), ignore_errors=True)
    if cfg.workers == 1:
        return worker_main(cfg_dict, str(out_dir), report_errors=False, job=job)
    return _launch_local(cfg_dict, cfg.workers, out_dir, job)


def _prepare_run_dir(cfg: RunConfig) -> Path:
    if cfg.resume:
        return Path(cfg.resume)
    out_dir = Path(cfg.runs_dir) / (cfg.name or default_run_name(cfg))
    if (out_dir / "events.jsonl").exists() or (out_dir / "summary.json").exists():
        raise JimuError(
            f"run folder {out_dir} already holds a run; pick another --name or --resume it"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise JimuError(f"cannot create run folder {out_dir}: {e.strerror}") from None
    return out_dir


def _launch_local(
    cfg_dict: dict[str, Any], workers: int, out_dir: Path, job: str
) -> dict[str, Any] | None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the agent's own log lines repeat what we report in one line below
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=workers,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        shutdown_timeout=5,
    )
    try:
        results = elastic_launch(config, worker_main)(cfg_dict, str(out_dir), True, job)
    except ChildFailedError as e:
        raise JimuError(_failure_line(out_dir, e)) from None
    return results.get(0)


def _failure_line(out_dir: Path, err: Exception) -> str:
    """One line naming the worker whose failure caused the others' and its error.

    Peers of a failed worker fail next with connection errors, so the cause is, in order:
    a user error (JimuError) that a worker reported; a worker that died without reporting
    (killed by a signal, out of memory); else the earliest reported error.
    """
    records = {}
    for f in error_dir(out_dir).glob("rank*.json"):
        try:
            r = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        records[r["rank"]] = r
    if records:
        log = out_dir / "worker-errors.log"
        text = "\n".join(f"--- rank {k}\n{r['traceback']}" for k, r in sorted(records.items()))
        atomic_write_text(log, text)
        shutil.rmtree(error_dir(out_dir), ignore_errors=True)
    users = sorted((r for r in records.values() if r["user_error"]), key=lambda r: r["time"])
    if users:
        return f"worker {users[0]['rank']}: {_first_line(users[0]['message'])}"
    failures = getattr(err, "failures", {})
    for rank, failure in sorted(failures.items()):
        if rank not in records:
            code = failure.exitcode
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            return f"worker {rank} died ({how}) without reporting an error"
    if not records:
        return f"a worker failed: {_first_line(str(err))}"
    first = min(records.values(), key=lambda r: r["time"])
    return f"worker {first['rank']} failed: {_first_line(first['message'])} (tracebacks in {out_dir / 'worker-errors.log'})"


def _first_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[0] if lines else "(no message)"
