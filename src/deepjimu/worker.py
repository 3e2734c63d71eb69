"""What each worker process runs: process group, data, model, strategy.fit, summary."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from deepjimu.atomic import atomic_write_text, no_space, space_error
from deepjimu.budget import join_memory_group
from deepjimu.config import RunConfig
from deepjimu.cost.compress import CostModel, save_choice
from deepjimu.data import DataOptions, DataSplits, load_dataset
from deepjimu.devices import free_port, pick_device
from deepjimu.emulate import free_comm_threads, join_own_group, thread_ids
from deepjimu.errors import Interrupted, JimuError, OutOfMemory, one_line, signals_interrupt
from deepjimu.launchers import placement
from deepjimu.leave import group_started, leave, leave_at_exit
from deepjimu.measure.measurer import ThisMachine
from deepjimu.measure.probe import measure
from deepjimu.measure.speeds import balance_speeds, time_shared
from deepjimu.memory import cap_allocator, out_of_memory
from deepjimu.models import build_model
from deepjimu.options import DdpOptions, narrow
from deepjimu.precision import matmul_precision
from deepjimu.record.folder import (
    MORE_ROOM,
    check_new,
    claim_for_job,
    lock_run_dir,
    requeued,
    stopped_line,
)
from deepjimu.run import Run
from deepjimu.starting import adopt
from deepjimu.strategies import get_strategy
from deepjimu.strategies.registry import builds_in_parts, entry
from deepjimu.summary import summarise
from deepjimu.threads import ThreadPlan, plan_threads

__all__ = [
    "ModelFactory",
    "default_run_name",
    "error_dir",
    "run_dir_of",
    "spawned_worker",
    "worker_main",
]

# a picklable callable that builds the model (deepjimu.fit): it crosses to spawned workers
ModelFactory = Callable[[], nn.Sequential]
# the data set as the local launcher read it: the splits themselves (a worker in the
# launcher's own process) or the file it saved them to (DataSplits.save; spawned workers)
Prepared = DataSplits | str | None

_TIMEOUT = datetime.timedelta(minutes=30)
# how long a failed worker waits before it exits: several of the agent's polls (launch.py
# polls every 0.1 s), so that the agent sees a peer that died first (spawned_worker)
_LINGER_S = 0.5
# key in torch elastic's job store: the run folder this torchrun job owns (see _claim)
_CLAIM_KEY = "deepjimu/run_dir"
# the exit code of a spawned worker that failed and could not write its error record (a
# full disk, a removed run folder): sysexits' "cannot create output file". The launcher
# then says what it can without the record (launch._failure_line)
UNREPORTED_EXIT = os.EX_CANTCREAT
# set in a worker whose error record could not be written (spawned_worker's exit code)
_unreported = False


def default_run_name(cfg: RunConfig, job: str = "train") -> str:
    """``<strategy>-<dataset>-<YYYYmmdd-HHMMSS>``; a probe's ``probe-<strategy>-...``, so
    that its folder (which holds only ``probe.json``) does not read as a run's."""
    name = f"{cfg.strategy}-{cfg.dataset}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    return f"probe-{name}" if job == "probe" else name


def run_dir_of(cfg: RunConfig, job: str = "train") -> Path:
    """The run folder of ``cfg``: the one it resumes, else ``<runs-dir>/<name>`` (``job``:
    ``train`` or ``probe``, for the default name)."""
    if cfg.resume:
        return Path(cfg.resume)
    return Path(cfg.runs_dir) / (cfg.name or default_run_name(cfg, job))


def error_dir(out_dir: Path) -> Path:
    """Where failing workers leave their error for the launcher to report."""
    return out_dir / ".errors"


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def worker_main(
    cfg_dict: dict[str, Any],
    out_dir: str | None,
    report_errors: bool = True,
    plan: ThreadPlan | None = None,
    job: str = "train",
    model_factory: ModelFactory | None = None,
    data: Prepared = None,
) -> dict[str, Any] | None:
    """Entry point of one worker (rank from the environment). Returns the summary on rank 0.

    ``data``: the data set as the launcher already read it (see :data:`Prepared`); None:
    the worker reads it itself (a worker that another launcher started).

    ``model_factory`` (picklable, called once per worker) builds the model that
    ``cfg.model`` then only names (``factory:...``): :func:`deepjimu.fit` passes the user's own.

    ``plan`` is the launcher's thread plan (default: made here from the config and the
    local worker count). ``job`` is ``train``, or ``probe`` for ``jimu probe`` (rank 0
    returns the probe and its table instead of a summary). With ``report_errors`` a failure is written to ``<out_dir>/.errors/rank<r>.json`` before
    it propagates, so the launcher of several processes can name the worker and its error
    in one line (a run in the launcher's own process just raises).
    """
    cfg = RunConfig.from_dict(cfg_dict)
    rank = _env_int("RANK", 0)
    folder = Path(out_dir) if out_dir else None
    try:
        return _work(cfg, folder, plan, job, model_factory, data)
    except BaseException as e:
        if folder is not None and report_errors:
            _report(folder, rank, e)
        raise


def _report(folder: Path, rank: int, e: BaseException) -> None:
    """Write the error record of ``e`` for the launcher, or note that it could not be
    written (:data:`UNREPORTED_EXIT`): never where the run folder itself is gone, which
    would bring back a folder the user removed."""
    global _unreported
    record = {
        "rank": rank,
        "attempt": _env_int("TORCHELASTIC_RESTART_COUNT", 0),
        "time": time.time(),
        "user_error": isinstance(e, JimuError),
        "memory": isinstance(e, OutOfMemory),
        "message": str(e) if isinstance(e, JimuError) else f"{type(e).__name__}: {e}",
        "traceback": traceback.format_exc(),
    }
    errors = error_dir(folder)
    try:
        errors.mkdir(exist_ok=True)  # not parents: see above
        atomic_write_text(errors / f"rank{rank}.json", json.dumps(record))
    except (OSError, JimuError):
        _unreported = True
        with contextlib.suppress(OSError):
            errors.rmdir()  # only if empty: no other worker's record in it


def spawned_worker(
    cfg_dict: dict[str, Any],
    out_dir: str,
    plan: ThreadPlan,
    job: str,
    model_factory: ModelFactory | None = None,
    data_file: str | None = None,
    environ: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """:func:`worker_main` in a process the local launcher spawned (or forked: ``environ``,
    the launcher's environment, is made the worker's, :func:`deepjimu.starting.adopt`), which
    then leaves as :mod:`deepjimu.leave` says (multiprocessing would end it with ``sys.exit``).

    After a signal the worker has unwound and leaves at once, with 128 + the signal (130
    after Ctrl-C). After an error it has written its error record, and leaves with 1 (or
    :data:`UNREPORTED_EXIT` where it could not write it) after :data:`_LINGER_S`: torch elastic reports only the first exit it sees, and a peer that
    died without a word (SIGKILL, the out-of-memory killer) must be that one, so that
    the launcher can say how it died. After a summary the worker returns it to torch
    elastic, which passes it on, and leaves with 0 when the shutdown begins.
    """
    if environ is not None:
        adopt(environ)
    try:
        with signals_interrupt(once=True):  # SIGTERM (the launcher stopping us) unwinds too
            summary = worker_main(cfg_dict, out_dir, True, plan, job, model_factory, data_file)
    except KeyboardInterrupt as e:  # SIGINT, or Interrupted
        leave(getattr(e, "exit_code", 130))
    except Exception:
        time.sleep(_LINGER_S)
        leave(UNREPORTED_EXIT if _unreported else 1)
    leave_at_exit(0)
    return summary


def _work(
    cfg: RunConfig,
    out_dir: Path | None,
    plan: ThreadPlan | None,
    job: str,
    model_factory: ModelFactory | None = None,
    data: Prepared = None,
) -> dict[str, Any] | None:
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    join_own_group(rank)  # --emulate-speeds: this worker's CPU quota, before any work
    join_memory_group(local_rank)  # --memory-limit on a CPU: this worker's memory cgroup
    attempt = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
    plan = plan or plan_threads(local_world, cfg.threads, cfg.omp_wait)
    torch.set_num_threads(plan.threads)
    device = pick_device(cfg, local_rank, local_world)
    cap_allocator(cfg.memory_limit, device)  # --memory-limit on a GPU
    store = _join_group(cfg, rank, world, attempt, device)
    try:
        with contextlib.ExitStack() as held:
            joined = out_dir is None
            if out_dir is None:  # started by a launcher: rank 0 claims the run folder
                out_dir, resume, how = _claim(cfg, rank, world, store, attempt, held, job)
            elif attempt > 0:  # restarted by our launcher, which holds the folder
                resume, how = out_dir, f"restart {attempt}"
            elif again := requeued(out_dir):  # our launcher holds the folder it started
                resume, how = out_dir, f"requeue {again}"
            else:
                resume, how = (Path(cfg.resume) if cfg.resume else None), "--resume"
            if joined:  # rank 0 says what a signal kept, the only line of the run
                held.enter_context(_stopped_in(out_dir, rank))
            with matmul_precision(cfg.precision, device):
                try:
                    if job == "probe":
                        return _probe(cfg, out_dir, rank, world, device, data)
                    done = _train(
                        cfg, out_dir, rank, world, device, plan, resume, how, model_factory, data
                    )
                    _DONE["runs"] += 1
                    return done
                except torch.OutOfMemoryError as e:
                    raise out_of_memory(cfg.memory_limit, device, e) from None
                except Exception as e:
                    problem = _folder_problem(out_dir, rank, e)
                    if problem is None:
                        raise
                    raise problem from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


_DONE = {"attempt": -1, "runs": 0}
"""The runs this process finished under a launcher at its restart count: the same sequence
on every rank. A restarted job (new processes) counts from 0 again and finds its claim."""


def _join_group(
    cfg: RunConfig, rank: int, world: int, attempt: int, device: torch.device
) -> dist.Store | None:
    """The job's store under a launcher (None without one), and the process group, where
    the run has several workers or its strategy needs one even alone."""
    # under a launcher (torch elastic: ours or torchrun) the job's store outlives restarts
    store, threads = None, thread_ids()
    if "MASTER_ADDR" in os.environ:
        job_store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=_TIMEOUT))
        # a script may run several times in one launcher's processes (deepjimu.fit called
        # twice under torchrun): each run keys of its own, or the second would read the
        # first's claim and group
        if _DONE["attempt"] != attempt:
            _DONE.update(attempt=attempt, runs=0)
        store = dist.PrefixStore(f"deepjimu/run-{_DONE['runs']}", job_store)
    if world > 1 or entry(cfg.strategy).traits.needs_group:
        group_started()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if store is not None:
            # torch elastic keeps one store for all restarts of a job (pytorch/pytorch#135712):
            # a restarted group would read the addresses of its dead predecessors and fail
            # in Gloo's connectFullMesh, so each attempt gets keys of its own
            group_store = dist.PrefixStore(f"deepjimu/attempt-{attempt}", store)
            dist.init_process_group(
                backend, rank=rank, world_size=world, timeout=_TIMEOUT, store=group_store
            )
        else:  # a one-worker run that still needs a group (ddp x1) has no launcher
            dist.init_process_group(
                backend,
                rank=rank,
                world_size=world,
                timeout=_TIMEOUT,
                init_method=f"tcp://127.0.0.1:{free_port()}",
            )
        free_comm_threads(threads)  # --emulate-speeds slows the device, not the network
    return store


@contextlib.contextmanager
def _stopped_in(out_dir: Path, rank: int) -> Iterator[None]:
    """A joined worker stopped by a signal: on rank 0 the line naming the last checkpoint
    and how to go on (every task of the launcher got the signal: the others say nothing,
    :func:`deepjimu.cli.main`)."""
    try:
        yield
    except Interrupted as e:
        if rank != 0:
            raise
        line = stopped_line(e.signum, out_dir, placement().train_command, every=False)
        raise Interrupted(e.signum, line) from None


def _folder_problem(out_dir: Path, rank: int, e: Exception) -> JimuError | None:
    """The one line for a failure that the run folder explains, else None: the folder was
    removed while the run went (every later error follows from that; judged on rank 0,
    which made it: on other machines it may be absent), or a write found no room on its
    disk (the one that failed names its file; others, the folder)."""
    if rank == 0 and not out_dir.is_dir():
        return JimuError(
            f"run folder {out_dir} was removed while the run was going; start the run again"
        )
    if no_space(e):
        assert isinstance(e, OSError)
        what = f"cannot write {e.filename}" if e.filename else "a write failed"
        return space_error(out_dir, e, what, MORE_ROOM)
    return None


def _claim(
    cfg: RunConfig,
    rank: int,
    world: int,
    store: dist.Store | None,
    attempt: int,
    held: contextlib.ExitStack,
    job: str = "train",
) -> tuple[Path, Path | None, str]:
    """Collective, under a launcher (torchrun, srun, mpirun): the run folder, where to
    resume from, and why.

    Rank 0 takes the folder's lock for the life of its process (``held``). torchrun
    restarts every worker after a failure, so the folder must outlive the processes: the
    first attempt records it in the job's store (kept by torchrun's agent for all restarts
    of this job, and only this job), and a later attempt that finds it there goes on from
    that folder's latest checkpoint. Without an agent (srun, mpirun) the store is rank 0's
    ``env://`` store, new with every start; a Slurm job requeued (its id kept) finds its
    id in the folder it started instead (:func:`deepjimu.record.folder.requeued`). A folder that
    no attempt of this job claimed is a new run's and must be free, whatever the restart
    count says.
    """
    box: list[Any] = [None]
    if rank == 0:
        try:
            claimed = (
                store.get(_CLAIM_KEY).decode() if store and store.check([_CLAIM_KEY]) else None
            )
            folder = Path(claimed) if claimed else run_dir_of(cfg, job)
            held.enter_context(lock_run_dir(folder))
            if claimed:
                box[0] = ("ok", (folder, folder, f"restart {attempt}"))
            elif again := requeued(folder):  # a Slurm job goes on in the folder it started
                box[0] = ("ok", (folder, folder, f"requeue {again}"))
            else:
                if not cfg.resume:
                    check_new(folder)
                if store is not None:
                    store.set(_CLAIM_KEY, str(folder))
                box[0] = ("ok", (folder, Path(cfg.resume) if cfg.resume else None, "--resume"))
            claim_for_job(folder)
        except JimuError as e:
            box[0] = ("error", str(e))
    if world > 1:
        dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise JimuError(value)
    result: tuple[Path, Path | None, str] = value
    return result


def _train(
    cfg: RunConfig,
    out_dir: Path,
    rank: int,
    world: int,
    device: torch.device,
    plan: ThreadPlan,
    resume: Path | None,
    how: str,
    model_factory: ModelFactory | None = None,
    given: Prepared = None,
) -> dict[str, Any] | None:
    strategy_cls = get_strategy(cfg.strategy)
    run = Run(cfg, out_dir, rank, world, device, ThisMachine())
    run.resumed_from = resume
    data = _data(cfg, given, run)
    if rank == 0 and data.info and not cfg.quiet:
        print(f"{cfg.dataset}: " + ", ".join(f"{k} {v}" for k, v in data.info.items()))
    strategy = strategy_cls(cfg)
    traits = entry(cfg.strategy).traits
    parts = world > 1 and model_factory is None and builds_in_parts(cfg)
    # a split or sharded model's worker plans on the model's shapes, then builds it a block
    # at a time, keeping its own blocks (or its shards of each) alone
    with torch.device("meta") if parts else contextlib.nullcontext():
        model = _model(cfg, data, model_factory)
    # each rank's speed, where the run may balance its work by it (--balance auto, speed)
    if traits.balances:
        sample = data.train_x[:64].to(device), data.train_y[:64].to(device)
        balance_speeds(model, *sample, run, resume, time_shared(cfg.emulate_speeds, plan, device))
    if parts:
        place = strategy.placer(model, data, run)
        assert place is not None, "a strategy that builds in parts places its blocks"
        model = build_model(
            cfg.model, data.feature_shape, data.num_classes, cfg.seed, place, cfg.dropout
        )
    if traits.shards_data:
        data = data.shard(rank, world, run.speeds)
    data = data.to(strategy.data_device(device))
    if resume is not None:
        _resume(cfg, run, model, resume, how)
    if rank == 0:  # only now: a resume that fails above leaves the folder as it was
        atomic_write_text(out_dir / "config.json", json.dumps(cfg.to_saved(), indent=2))
    run.begin_fit()
    try:
        result = strategy.fit(model, data, run)
    finally:  # the progress bar ends its line, so the launcher's one line starts its own
        run.close()
    gathered = run.gather_objects((run.stats.as_list(), run.stats.sent_by_kind))
    summary = None
    if rank == 0:
        summary = summarise(cfg, out_dir, world, device, plan, run, model, data, result, gathered)
    run.barrier()  # every rank returns once summary.json is written (fit reads it on each)
    return summary


def _model(cfg: RunConfig, data: DataSplits, model_factory: ModelFactory | None) -> nn.Sequential:
    """The run's model: built from its spec, or by the user's factory (``deepjimu.fit``)."""
    if model_factory is None:
        return build_model(
            cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed, dropout=cfg.dropout
        )
    # the same start on every rank, as build_model's seeded init
    torch.manual_seed(cfg.seed)
    return model_factory()


def _resume(cfg: RunConfig, run: Run, model: nn.Module, resume: Path, how: str) -> None:
    """Load the model's weights from the checkpoint in ``resume`` (if any) and go on with
    the run's history; a ``--resume`` without a checkpoint, or one that does not fit, ends
    in one line."""
    ckpt = run.load_checkpoint(resume)
    if ckpt is None and cfg.resume:
        raise JimuError(f"--resume {resume}: no checkpoint in {resume / 'checkpoint'}")
    if ckpt is not None:
        held = model.state_dict()  # a split model's rank: its own blocks, the others meta
        try:
            if set(ckpt.model_state) != set(held):
                raise RuntimeError(f"keys {sorted(set(ckpt.model_state) ^ set(held))[:4]}")
            own = {k: ckpt.model_state[k] for k, v in held.items() if not v.is_meta}
            model.load_state_dict(own, strict=False)
        except RuntimeError as e:
            raise JimuError(
                f"checkpoint of {resume} does not fit model {cfg.model}: {one_line(e)[:200]}"
            ) from None
    run.continue_history(ckpt, how)


def _data(cfg: RunConfig, given: Prepared, run: Run) -> DataSplits:
    """The data set: as the launcher read it (``given``), else read here; with
    ``--download`` and several workers, rank 0 downloads and the others then read its files."""
    if isinstance(given, DataSplits):
        return given
    if given is not None:
        return DataSplits.load(Path(given))
    if cfg.download and run.world > 1:
        if run.rank == 0:
            load_dataset(cfg.dataset, DataOptions.from_config(cfg))
        run.barrier()
    return load_dataset(cfg.dataset, DataOptions.from_config(cfg))


def _probe(
    cfg: RunConfig,
    out_dir: Path,
    rank: int,
    world: int,
    device: torch.device,
    given: Prepared = None,
) -> dict[str, Any] | None:
    """``jimu probe``: measure the link and this device, write ``probe.json`` with the cost model's predictions."""
    run = Run(cfg, out_dir, rank, world, device, ThisMachine())
    data = _data(cfg, given, run).shard(rank, world).to(device)
    model = build_model(cfg.model, data.feature_shape, data.num_classes, seed=cfg.seed)
    probe = measure(model.to(device), data, narrow(cfg, DdpOptions), run)
    if rank != 0:
        return None
    choice, predictions = CostModel(probe).choose()
    text = save_choice(probe, choice, predictions, out_dir / "probe.json")
    return {"probe": probe.to_dict(), "choice": choice, "text": text}
