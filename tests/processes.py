"""Test helpers for runs in other processes: start ``jimu`` or torchrun, wait for epochs, find workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "FAULT",
    "children",
    "descendants",
    "env",
    "events",
    "fault_flags",
    "params",
    "start",
    "wait_for_epochs",
]

# the run of the fault tests: short, a checkpoint every epoch, one thread (as under torchrun)
FAULT: dict[str, Any] = {
    "model": "mlp:16x1",
    "epochs": 8,
    "checkpoint_every": 1,
    "threads": 1,
    "quiet": True,
}


def fault_options(strategy: str) -> dict[str, Any]:
    """:data:`FAULT` for ``strategy``: a strategy that may split its work by the workers'
    measured speeds (``--balance auto``) splits evenly, so that two runs of the config
    (one killed and resumed, one not) split alike whatever a busy machine measured."""
    even = {"balance": "even"} if strategy in ("ddp", "admm", "model-parallel", "pipeline") else {}
    return {**FAULT, **even}


def fault_flags(strategy: str, **extra: Any) -> list[str]:
    """:func:`fault_options` of ``strategy`` and ``extra`` as ``jimu train`` flags."""
    out = []
    for k, v in {**fault_options(strategy), **extra}.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [flag, str(v)]
    return out


def env() -> dict[str, str]:
    """This environment, with this checkout's ``src`` first on PYTHONPATH."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def start(args: list[str], torchrun: list[str] | None = None) -> subprocess.Popen[str]:
    """Start ``jimu <args>`` (under ``torchrun <torchrun>`` if given) in a session of its own."""
    cmd = [sys.executable, "-m", "deepjimu", *args]
    if torchrun is not None:
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun, "-m", "deepjimu", *args]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        start_new_session=True,
    )


def events(run_dir: Path) -> list[dict[str, Any]]:
    """The whole lines of ``events.jsonl`` so far (none if it does not exist yet)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines(keepends=True) if x.endswith("\n")]


def wait_for_epochs(
    run_dir: Path, n: int, proc: subprocess.Popen[str], timeout: float = 180
) -> None:
    """Wait until the run has logged ``n`` epochs; fail if it ends or times out first."""
    deadline = time.time() + timeout
    while len(events(run_dir)) < n:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before epoch {n}: {proc.communicate()[1][-3000:]}")
        if time.time() > deadline:
            raise AssertionError(f"the run did not reach epoch {n} in {timeout} s")
        time.sleep(0.01)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def params(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model of a run folder's latest checkpoint."""
    latest = (run_dir / "checkpoint" / "latest").read_text().strip()
    return torch.load(run_dir / "checkpoint" / latest / "model.pt", weights_only=True)
