"""Start a run: in this process, as N local workers under torch's elastic launcher, or as one
worker of a group that torchrun, Slurm's srun or an MPI launcher started."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepjimu.atomic import atomic_write_text, space_error
from deepjimu.config import RunConfig
from deepjimu.data import DataOptions, DataSplits, load_dataset
from deepjimu.devices import pick_device
from deepjimu.emulate import parse_speeds, speed_groups
from deepjimu.errors import Interrupted, JimuError, OutOfMemory, signals_interrupt
from deepjimu.launchers import Launcher, Placement, placement
from deepjimu.precision import check_precision
from deepjimu.preflight import (
    Budget,
    budget_groups,
    check_machine,
    job_budget,
    with_budget_peaks,
)
from deepjimu.record.folder import (
    MORE_ROOM,
    check_new,
    check_resume,
    claim_for_job,
    kept_line,
    lock_run_dir,
    requeued,
    stopped_line,
)
from deepjimu.starting import start_method
from deepjimu.strategies.registry import compressing
from deepjimu.threads import ThreadPlan, plan_threads, scoped_env
from deepjimu.units import format_bytes
from deepjimu.validation import defaults_line, validate
from deepjimu.worker import (
    UNREPORTED_EXIT,
    ModelFactory,
    error_dir,
    run_dir_of,
    spawned_worker,
    worker_main,
)

if TYPE_CHECKING:
    from torch import nn

__all__ = ["joined_config", "probe", "train"]

# where a failed run's workers' tracebacks go
_ERRORS_LOG = "worker-errors.log"
# a disk with less free space than this could not hold a worker's error record (a few KB,
# in whole blocks): a worker that could not write one found it full
_FULL_BELOW = 2**20


def train(
    cfg: RunConfig, plan: ThreadPlan | None = None, model_factory: ModelFactory | None = None
) -> dict[str, Any] | None:
    """Validate ``cfg``, start its workers, wait, and return rank 0's summary.

    Locally, ``cfg.workers`` processes are started with
    :func:`torch.distributed.launcher.api.elastic_launch`, each with the OpenMP environment
    of the run's :class:`~deepjimu.threads.ThreadPlan`; after a failure it restarts them
    all up to ``cfg.max_restarts`` times, and they go on from the latest checkpoint. One
    worker runs in this process when it needs no restarts and this process already has the
    plan's OpenMP wait policy (OpenMP reads it once, when torch loads), else it is started
    like the others. This process holds the run folder's lock until the run ends. Started by
    torchrun, Slurm's srun or an MPI launcher (:mod:`deepjimu.launchers`), this process is
    one of the workers and joins their group (rank 0 holds the lock); the CLI has set its
    environment from ``plan`` before torch loaded. In a Slurm job that was requeued, the run
    goes on in the folder the job started (:func:`deepjimu.record.folder.requeued`).

    Args:
        cfg: the run's options (validated here).
        plan: the thread plan, when the caller already applied it (a launcher's worker); default: made
            here from ``cfg`` and the number of local workers.
        model_factory: a picklable callable building the model in every worker, in place
            of ``cfg.model``'s spec (:func:`deepjimu.fit`).

    Raises:
        ConfigErrors: bad config, or a resume that its checkpoint contradicts (before any
            worker starts).
        JimuError: bad data files, a run folder in use or already holding a run, or a
            worker failed (its rank and error in one line).
        Interrupted: SIGINT or SIGTERM stopped the run (every worker is ended first).
    """
    return _start(cfg, "train", plan, model_factory)


def probe(cfg: RunConfig, plan: ThreadPlan | None = None) -> dict[str, Any] | None:
    """``jimu probe``: start ``cfg``'s workers as :func:`train` does, but to probe, not train.

    The workers time the group's collectives and a ddp step of ``cfg``'s model with each
    compressor (:mod:`deepjimu.measure.probe`); rank 0 writes ``<run folder>/probe.json``
    with the cost model's predictions and returns ``{"probe", "choice", "text"}``. The
    strategy is always the one whose ``--compress`` the probe serves
    (:func:`~deepjimu.strategies.registry.compressing`).

    Raises:
        ConfigErrors, JimuError, Interrupted: as :func:`train`.
    """
    return _start(dataclasses.replace(cfg, strategy=compressing()), "probe", plan)


def _start(
    cfg: RunConfig, job: str, plan: ThreadPlan | None, model_factory: ModelFactory | None = None
) -> dict[str, Any] | None:
    place = placement()
    with signals_interrupt(once=place.joined):
        if place.joined:
            return _join(cfg, place, job, plan, model_factory)
        model = _model(model_factory)
        given, cfg = cfg, validate(cfg, model)
        _say_defaults(given, cfg, place.rank, job)
        assert cfg.workers is not None
        if cfg.resume:
            check_resume(cfg)
        plan = plan or plan_threads(cfg.workers, cfg.threads, cfg.omp_wait)
        # the device the workers will pick, so that --device cuda without GPUs or --precision
        # tf32 on a CPU fail here, before the run folder exists
        check_precision(cfg.precision, pick_device(cfg, 0, cfg.workers))
        start_method(budgeted=False)  # a bad DEEPJIMU_START_METHOD, before the folder too
        # read (and download) the data once here, so bad files fail before any worker starts
        data = load_dataset(cfg.dataset, DataOptions.from_config(cfg))
        need = check_machine(cfg, plan, data, model)
        out_dir = run_dir_of(cfg, job)
        with contextlib.ExitStack() as held:
            if cfg.emulate_speeds:  # refused here, before the run folder, without root
                factors = parse_speeds(cfg.emulate_speeds)
                held.enter_context(
                    scoped_env(held.enter_context(speed_groups(factors, plan.threads)))
                )
            budget = budget_groups(cfg, held)
            held.enter_context(lock_run_dir(out_dir))
            if not cfg.resume and not requeued(out_dir):
                check_new(out_dir)
            claim_for_job(out_dir)
            try:
                return _run_workers(
                    cfg, out_dir, plan, job, data, model_factory, job_budget(budget, need)
                )
            except Interrupted as e:
                raise Interrupted(e.signum, stopped_line(e.signum, out_dir)) from None


def _join(
    cfg: RunConfig,
    place: Placement,
    job: str,
    plan: ThreadPlan | None,
    model_factory: ModelFactory | None,
) -> dict[str, Any] | None:
    """Run this process as rank ``place.rank`` of the group its launcher started (rank 0
    claims the run folder: :func:`deepjimu.worker.worker_main`)."""
    given = joined_config(cfg, place)
    cfg = validate(given, _model(model_factory))
    if cfg.memory_limit and pick_device(cfg, place.local_rank, place.local_world).type != "cuda":
        # the memory groups are made by the launcher of every worker (on a GPU each caps its
        # own allocator)
        raise JimuError(
            f"--memory-limit on a CPU runs under jimu's own launcher (jimu train --workers N), "
            f"not under {place.command}; give the launcher's own limit (sbatch --mem-per-cpu, "
            f"a cgroup) instead"
        )
    _say_defaults(given, cfg, place.rank, job)
    if cfg.resume:
        check_resume(cfg)
    plan = plan or plan_threads(place.local_world, cfg.threads, cfg.omp_wait)
    return worker_main(cfg.to_dict(), None, True, plan, job, model_factory)


def _say_defaults(given: RunConfig, cfg: RunConfig, rank: int, job: str) -> None:
    """Rank 0 of a training run names what its data family's table set (``defaults for
    graph data: ...``), once the run validated (a bad one ends in its error line alone)."""
    if job == "train" and not cfg.quiet and rank == 0:
        line = defaults_line(given)
        if line is not None:
            print(line, flush=True)


def joined_config(cfg: RunConfig, place: Placement) -> RunConfig:
    """``cfg`` for a worker of ``place``'s launcher: its workers are the launcher's world.

    Raises:
        JimuError: ``--workers`` disagrees with the world, or an option that only jimu's
            own launcher serves (``--emulate-speeds``, ``--max-restarts``).
    """
    world = place.world
    if cfg.workers is not None and cfg.workers != world:
        raise JimuError(f"--workers {cfg.workers} disagrees with {place.world_from} {world}")
    if cfg.emulate_speeds:  # the groups are made by the launcher of every worker
        raise JimuError(
            "--emulate-speeds runs under jimu's own launcher (jimu train --workers N), "
            f"not under {place.command}"
        )
    if cfg.max_restarts:  # the launcher restarts its workers, not this process
        instead = {
            Launcher.TORCHRUN: f"give torchrun --max-restarts {cfg.max_restarts} instead",
            Launcher.SLURM: "submit with sbatch --requeue instead: a requeued job goes on "
            "from its checkpoint",
        }.get(place.launcher, "jimu restarts only the workers it starts itself")
        raise JimuError(f"under {place.command}, {instead} (max-restarts: {cfg.max_restarts})")
    return dataclasses.replace(cfg, workers=world)


def _model(model_factory: ModelFactory | None) -> nn.Sequential | None:
    """The factory's model, for validation to check (its blocks, what the strategy trains)."""
    return model_factory() if model_factory is not None else None


def _run_workers(
    cfg: RunConfig,
    out_dir: Path,
    plan: ThreadPlan,
    job: str,
    data: DataSplits,
    model_factory: ModelFactory | None = None,
    budget: Budget | None = None,
) -> dict[str, Any] | None:
    assert cfg.workers is not None
    budget = budget or Budget()
    cfg_dict = {**cfg.to_dict(), "download": False}
    # an earlier run's errors (a failed run leaves them; a new run may reuse its name)
    shutil.rmtree(error_dir(out_dir), ignore_errors=True)
    (out_dir / _ERRORS_LOG).unlink(missing_ok=True)
    if not cfg.quiet:
        print(f"threads: {plan.describe()}", flush=True)
    # in this process only where nothing sets it apart (--emulate-speeds, --memory-limit:
    # a cgroup of its own)
    if (
        cfg.workers == 1
        and not cfg.max_restarts
        and not cfg.emulate_speeds
        and budget.groups is None
        and plan.matches(os.environ)
    ):
        return worker_main(cfg_dict, str(out_dir), False, plan, job, model_factory, data)
    summary = _launch_local(
        cfg_dict, cfg.workers, cfg.max_restarts, out_dir, plan, job, data, model_factory, budget
    )
    shutil.rmtree(error_dir(out_dir), ignore_errors=True)  # errors of attempts that restarted
    if summary is not None and budget.groups is not None:
        summary = with_budget_peaks(summary, budget.groups, cfg.workers, out_dir)
    return summary


def _launch_local(
    cfg_dict: dict[str, Any],
    workers: int,
    max_restarts: int,
    out_dir: Path,
    plan: ThreadPlan,
    job: str,
    data: DataSplits,
    model_factory: ModelFactory | None = None,
    budget: Budget | None = None,
) -> dict[str, Any] | None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the agent's own log lines (and torch.multiprocessing's "Terminating process ... via
    # signal SIGTERM" as it stops the others) repeat what we report in one line below; each
    # module sets its own logger's level, so the parents' levels alone do not silence them
    quiet = ("torch.distributed.elastic", "torch.multiprocessing")
    for name in [*quiet, *logging.root.manager.loggerDict]:
        if name.startswith(quiet):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    # the agent's per-worker files (error.json) go to a folder of ours, removed when the
    # launch ends: by default each launch leaves a torchelastic_* folder in TMPDIR for good
    logs = tempfile.TemporaryDirectory(prefix="jimu-elastic-")
    try:
        data_file = _saved(data, Path(logs.name) / "data.pt")
        config = LaunchConfig(
            logs_specs=DefaultLogsSpecs(log_dir=logs.name),
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=workers,
            run_id=uuid.uuid4().hex,
            rdzv_backend="c10d",
            rdzv_endpoint="127.0.0.1:0",
            max_restarts=max_restarts,
            monitor_interval=0.1,
            start_method=start_method(budget is not None and budget.groups is not None),
            shutdown_timeout=5,
        )
        with scoped_env(plan.env()):  # the spawned workers start with the plan's environment
            results = elastic_launch(config, spawned_worker)(
                cfg_dict, str(out_dir), plan, job, model_factory, data_file, dict(os.environ)
            )
    except ChildFailedError as e:
        _end_bar_line(cfg_dict, out_dir)
        raise _failure(out_dir, e, workers, budget) from None
    except SignalException as e:  # the agent has stopped every worker
        _end_bar_line(cfg_dict, out_dir)
        shutil.rmtree(error_dir(out_dir), ignore_errors=True)  # each says only: interrupted
        raise Interrupted(int(e.sigval)) from None
    finally:
        logs.cleanup()
    summary: dict[str, Any] | None = results.get(0)  # rank 0's return value
    return summary


def _saved(data: DataSplits, path: Path) -> str | None:
    """``data`` saved to ``path`` for the workers to map (:meth:`DataSplits.save`), or None
    where there is no room for it: each worker then reads the data set itself, as before."""
    try:
        data.save(path)
    except (OSError, RuntimeError):  # torch's own file writer raises RuntimeError
        path.unlink(missing_ok=True)
        return None
    return str(path)


def _end_bar_line(cfg_dict: dict[str, Any], out_dir: Path) -> None:
    """End the line of rank 0's progress bar if rank 0 could not (killed, or stuck until
    the agent killed it), so that the one line we print next starts a line of its own.
    A worker that unwinds closes its bar, then writes its error record."""
    if not cfg_dict["quiet"] and not (error_dir(out_dir) / "rank0.json").exists():
        print(file=sys.stderr, flush=True)


def _failure(out_dir: Path, err: Exception, workers: int, budget: Budget | None) -> JimuError:
    """The error of a failed run (:func:`_failure_line`): :class:`OutOfMemory` where a
    worker passed its memory (its group's counter, or the error it reported)."""
    memory = budget.line(workers, out_dir, _killed(err)) if budget is not None else None
    records = _last_records(out_dir)
    line = _failure_line(out_dir, err, workers, memory, records)
    short = memory is not None or any(r.get("memory") for r in records.values())
    return (OutOfMemory if short else JimuError)(line)


def _last_records(out_dir: Path) -> dict[int, dict[str, Any]]:
    """The workers' error records of the run's last attempt, by rank (after restarts, only
    the last attempt's errors explain the failure)."""
    found = []
    for f in error_dir(out_dir).glob("rank*.json"):
        try:
            found.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    last = max((r.get("attempt", 0) for r in found), default=0)
    return {r["rank"]: r for r in found if r.get("attempt", 0) == last}


def _failure_line(
    out_dir: Path,
    err: Exception,
    workers: int = 2,
    memory: str | None = None,
    records: dict[int, dict[str, Any]] | None = None,
) -> str:
    """One line naming the worker whose failure caused the others' and its error (a run of
    one worker reports a user error as it is: there is no other worker to tell it from).

    Peers of a failed worker fail next with connection errors, so the cause is, in order:
    the run folder removed under the run; a worker that passed its memory budget (the
    kernel's out-of-memory killer, read from its group's counter); a user error (JimuError)
    that a worker reported;
    a worker that died without reporting (killed by a signal, out of memory: with the
    checkpoint to go on from, or unable to write its record: a full disk); else the
    earliest reported error. ``memory``: the line of a worker past its memory
    (:meth:`Budget.line`), ``records`` the workers' (read here by default). The records
    are removed; their tracebacks go to ``worker-errors.log`` where the disk has room.
    """
    if not out_dir.is_dir():  # nothing to read, and nothing to write back into it
        return f"run folder {out_dir} was removed while the run was going; start the run again"
    records = _last_records(out_dir) if records is None else records
    log: Path | None = None
    if records or memory:  # the folder says why the run stopped
        text = "\n".join(
            [memory or "", *(f"--- rank {k}\n{r['traceback']}" for k, r in sorted(records.items()))]
        ).lstrip("\n")
        try:
            atomic_write_text(out_dir / _ERRORS_LOG, text)
            log = out_dir / _ERRORS_LOG
        except (OSError, JimuError):  # the line below says what matters
            pass
    shutil.rmtree(error_dir(out_dir), ignore_errors=True)
    if memory is not None:
        return memory
    users = sorted((r for r in records.values() if r["user_error"]), key=lambda r: r["time"])
    if users:
        line = _first_line(users[0]["message"])
        return line if workers == 1 else f"worker {users[0]['rank']}: {line}"
    failures = getattr(err, "failures", {})
    for rank, failure in sorted(failures.items()):
        if rank not in records:
            code = failure.exitcode
            if code == UNREPORTED_EXIT:
                return _unreported_line(rank, out_dir)
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            return f"worker {rank} died ({how}) without reporting an error; {kept_line(out_dir)}"
    if not records:
        return f"a worker failed: {_first_line(str(err))}"
    first = min(records.values(), key=lambda r: r["time"])
    where = f" (tracebacks in {log})" if log is not None else ""
    return f"worker {first['rank']} failed: {_first_line(first['message'])}{where}"


def _killed(err: Exception) -> int | None:
    """The first worker that torch's launcher saw ended by SIGKILL (the out-of-memory
    killer's signal), None where none was."""
    failures = getattr(err, "failures", {})
    return next((r for r, f in sorted(failures.items()) if f.exitcode == -signal.SIGKILL), None)


def _unreported_line(rank: int, out_dir: Path) -> str:
    """The line for a worker that failed and could not write its error record: from what
    needs no record, the run folder's free space (a full disk is the usual cause)."""
    head = f"worker {rank} failed and could not write its error record in {out_dir}"
    try:
        free = shutil.disk_usage(out_dir).free
    except OSError:
        return head
    if free < _FULL_BELOW:
        return str(space_error(out_dir, OSError(errno.ENOSPC, "full"), head, MORE_ROOM))
    return f"{head} ({format_bytes(free)} free there)"


def _first_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[0] if lines else "(no message)"
