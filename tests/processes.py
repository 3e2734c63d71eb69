"""Test helpers for runs in other processes: start ``jimu`` or torchrun, wait for epochs, find workers."""

from __future__ import annotations

import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from deepjimu.record.checkpoint import model_state_of
from deepjimu.starting import START_METHOD

__all__ = [
    "FAULT",
    "children",
    "descendants",
    "env",
    "events",
    "fault_flags",
    "groups_left",
    "params",
    "run_warm",
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
    # admm's full-batch iteration on mlp:16x1 takes about 0.04 s: in 8 the run could end
    # before a test that saw its second epoch had killed it (seen on a loaded machine)
    longer = {"epochs": 40} if strategy == "admm" else {}
    return {**FAULT, **even, **longer}


def fault_flags(strategy: str, **extra: Any) -> list[str]:
    """:func:`fault_options` of ``strategy`` and ``extra`` as ``jimu train`` flags."""
    out = []
    for k, v in {**fault_options(strategy), **extra}.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [flag, str(v)]
    return out


def env() -> dict[str, str]:
    """This environment, with this checkout's ``src`` first on PYTHONPATH, and the workers
    spawned as a user's are (the suite's own launches fork theirs: tests/conftest.py)."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out.pop(START_METHOD, None)
    return out


# Modules a command's process imports before it does anything: 2.5-3.5 s of CPU per
# process on the 2-core CI machine, most of a short command's cost (torch 1.5 s, the
# torch._dynamo that torch's optimizers load 1.2 s, scikit-learn for digits).
WARM = [
    "torch",
    "torch._dynamo",
    "torch.optim",
    "sklearn.datasets",
    "deepjimu.cli",
    "deepjimu.launch",
    "deepjimu.worker",
]


def run_warm(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True)`` for
    ``python -m deepjimu ...`` and ``python SCRIPT ...``, in a process forked from one that
    has imported torch, scikit-learn and deepjimu and done nothing else
    (:mod:`multiprocessing`'s fork server, :data:`WARM` preloaded), so each command does
    not pay for those imports again. The child then runs what ``python`` would (the
    ``jimu`` entry point, or the script as ``__main__``) in ``cwd`` with :func:`env`, its
    output to files; it is a fresh process that has run no torch operation, as a forked
    DataLoader worker is. One difference from a new interpreter: OpenMP read its settings
    when the server loaded torch, so a one-worker run's thread plan sets its threads but
    not its wait policy (speed, not results). Any other command runs as a subprocess.
    """
    py = argv[0] == sys.executable
    if py and argv[1:3] == ["-m", "deepjimu"]:
        what: tuple[str, str | None, list[str]] = ("cli", None, argv[3:])
    elif py and len(argv) > 1 and argv[1].endswith(".py"):
        what = ("script", argv[1], argv[2:])
    else:
        return subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    out, err = cwd / f".warm-{os.getpid()}-{time.monotonic_ns()}", None
    out, err = out.with_suffix(".out"), out.with_suffix(".err")
    child = _forkserver().Process(
        target=_warm_child, args=(*what, str(cwd), env(), str(out), str(err))
    )
    child.start()
    child.join(timeout)
    if child.exitcode is None:  # its own session: the workers it started go too
        os.killpg(child.pid, signal.SIGKILL)
        child.join()
        raise subprocess.TimeoutExpired(argv, timeout)
    try:
        return subprocess.CompletedProcess(argv, child.exitcode, out.read_text(), err.read_text())
    finally:
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)


def _forkserver() -> Any:
    """This test process's fork server context, :data:`WARM` preloaded (started on first use)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(WARM)
    return ctx


def _warm_child(
    kind: str, script: str | None, args: list[str], cwd: str, environ: dict[str, str],
    out: str, err: str,
) -> None:  # fmt: skip
    """The child of :func:`run_warm`: a session of its own, ``cwd``, ``environ``, its
    output to ``out`` and ``err``, then what ``python`` would run."""
    os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the process's own stdout)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    if kind == "cli":
        from deepjimu.cli import entry

        sys.argv = ["jimu", *args]
        entry()
    assert script is not None
    sys.argv = [script, *args]
    path = Path(script).resolve()  # absolute: spawned workers find __main__ by its path
    sys.path.insert(0, str(path.parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


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


def whole_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: ``model``'s parameters whole, its DTensors' shards gathered on every rank."""
    from torch.distributed.tensor import DTensor  # here: most tests never load it

    return {
        k: p.full_tensor() if isinstance(p, DTensor) else p for k, p in model.named_parameters()
    }


def params(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model of a run folder's latest checkpoint."""
    latest = (run_dir / "checkpoint" / "latest").read_text().strip()
    return model_state_of(run_dir / "checkpoint" / latest)


def groups_left(parent: Path, before: set[str], wait: float = 180.0) -> set[str]:
    """The ``deepjimu-*`` cgroups under ``parent`` that were not there ``before`` and are still
    there after ``wait`` seconds: a run removes its own when it ends, and another test's run
    beside this one (the suite runs several at once) removes its own when that run ends, so
    only a group its run left behind stays."""
    deadline = time.monotonic() + wait
    while True:
        left = {p.name for p in parent.glob("deepjimu-*")} - before
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)
