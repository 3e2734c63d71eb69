"""Which launcher started this process (jimu itself, torchrun, Slurm's srun, an MPI launcher) and where it placed us.

The one place that decides: :func:`detect` is a pure function of the environment, and
:func:`placement` applies it to this process. Under Slurm or MPI it exports the variables
torch's ``env://`` rendezvous reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so that from there on the run joins its group as under torchrun.

The rule, first match wins:

1. torch elastic's agent (torchrun, or jimu's own launcher) started us: TORCHELASTIC_RUN_ID.
2. OpenMPI's ``mpirun``: OMPI_COMM_WORLD_SIZE > 1. Before Slurm: ``mpirun`` inside an
   allocation starts its daemons with ``srun``, whose SLURM_PROCID is the daemon's, not ours.
3. A task of an ``srun`` step of more than one task: SLURM_STEP_ID set and
   SLURM_STEP_NUM_TASKS > 1. A batch script has SLURM_PROCID 0 and the job's SLURM_NTASKS
   but no step id, so ``jimu train --workers 4`` inside ``sbatch`` starts its own workers,
   as does ``srun -n 1 jimu train --workers 4``.
4. A PMI launcher (MPICH's or Intel MPI's ``mpiexec``): PMI_SIZE > 1.
5. RANK and WORLD_SIZE set by any other launcher: joined as under torchrun.
6. Otherwise jimu starts its own workers (``local``).

No torch import: the CLI decides before torch loads (the thread plan needs the local
worker count first).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from deepjimu.choices import Choice
from deepjimu.errors import JimuError
from deepjimu.threads import set_env

__all__ = [
    "Launcher",
    "Placement",
    "detect",
    "expand_hostlist",
    "job_port",
    "placement",
    "slurm_job",
    "tasks_per_node",
]

# the ports a job id maps to (job_port): above the usual services, below the ephemeral range
_PORT_BASE, _PORT_SPAN = 20000, 20000


class Launcher(Choice):
    """What started this process: ``local`` is ``jimu train`` starting its own workers."""

    LOCAL = "local"
    TORCHRUN = "torchrun"
    SLURM = "slurm"
    MPI = "mpi"


@dataclass(frozen=True)
class Placement:
    """This process's place in its launcher's group.

    ``world_from`` names the launcher and the variable the world size came from (for
    messages: ``srun's SLURM_STEP_NUM_TASKS``). ``master_addr`` / ``master_port`` are the
    rendezvous (rank 0's store), None where the launcher sets them itself (torchrun) or
    there is no group (local).
    """

    launcher: Launcher
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    world_from: str = ""

    @property
    def command(self) -> str:
        """The launcher's command, for messages: ``jimu``, ``torchrun``, ``srun``, ``mpirun``."""
        return {
            Launcher.LOCAL: "jimu",
            Launcher.TORCHRUN: "torchrun",
            Launcher.SLURM: "srun",
            Launcher.MPI: "mpirun",
        }[self.launcher]

    @property
    def train_command(self) -> str:
        """How the user starts this run's ``jimu train`` again (before ``--resume runs/x``)."""
        if self.launcher == Launcher.SLURM:
            return f"srun -n {self.world} jimu train"
        if self.launcher == Launcher.MPI:
            return f"mpirun -np {self.world} jimu train"
        return "jimu train"

    @property
    def joined(self) -> bool:
        """True when this process is one worker of a group that another launcher started."""
        return self.launcher != Launcher.LOCAL

    def torch_env(self) -> dict[str, str]:
        """The variables torch's ``env://`` rendezvous and the worker read; empty where the
        launcher set them (torchrun) or there is no group (local)."""
        if self.launcher not in (Launcher.SLURM, Launcher.MPI):
            return {}
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world),
            "MASTER_ADDR": str(self.master_addr),
            "MASTER_PORT": str(self.master_port),
        }


def placement() -> Placement:
    """:func:`detect` on this process's environment; under Slurm or MPI its
    :meth:`Placement.torch_env` is exported (again the same on a second call).

    Raises:
        JimuError: as :func:`detect`.
    """
    found = detect(os.environ)
    set_env(found.torch_env())
    return found


def detect(environ: Mapping[str, str]) -> Placement:
    """The placement the launcher of a process with ``environ`` gave it (the module's rule).

    Args:
        environ: the process's environment.

    Returns:
        the placement: rank, world size, local rank and size, and under Slurm or MPI the
        rendezvous: MASTER_ADDR and MASTER_PORT where given, else the step's first node
        (Slurm) or this machine (MPI on one machine), and a port made from the job id.

    Raises:
        JimuError: a launcher's variable that is not a number, a rank outside the world,
            an unreadable Slurm node list, or MPI across machines without MASTER_ADDR.

    Example:
        >>> p = detect({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4",
        ...             "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        ...             "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURMD_NODENAME": "gpu07",
        ...             "SLURM_JOB_ID": "4711"})
        >>> (p.launcher, p.rank, p.world, p.local_world, p.master_addr, p.master_port)
        (<Launcher.SLURM: 'slurm'>, 1, 4, 2, 'gpu07', 24711)
        >>> detect({}).launcher
        <Launcher.LOCAL: 'local'>
    """
    env = environ
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env:
        return _torchrun(env)
    if _int(env, "OMPI_COMM_WORLD_SIZE", 1) > 1:
        return _mpi(env, "OMPI_COMM_WORLD", "OMPI_COMM_WORLD_LOCAL")
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env and _step_tasks(env)[1] > 1:
        return _slurm(env)
    if _int(env, "PMI_SIZE", 1) > 1:
        return _mpi(env, "PMI", "MPI_LOCAL")
    if "RANK" in env and "WORLD_SIZE" in env:
        return _torchrun(env)
    return Placement(Launcher.LOCAL)


def slurm_job(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The Slurm job this process runs in and how often it was requeued (SLURM_JOB_ID,
    SLURM_RESTART_COUNT), None outside Slurm. A requeued job keeps its id.

    Raises:
        JimuError: SLURM_RESTART_COUNT is not a number.

    Example:
        >>> slurm_job({"SLURM_JOB_ID": "4711", "SLURM_RESTART_COUNT": "1"})
        ('4711', 1)
    """
    job = environ.get("SLURM_JOB_ID")
    return (job, _int(environ, "SLURM_RESTART_COUNT", 0)) if job else None


def _torchrun(env: Mapping[str, str]) -> Placement:
    world = _int(env, "WORLD_SIZE", 1)
    return _checked(
        Placement(
            Launcher.TORCHRUN,
            rank=_int(env, "RANK", 0),
            world=world,
            local_rank=_int(env, "LOCAL_RANK", 0),
            local_world=_int(env, "LOCAL_WORLD_SIZE", world),
            world_from="torchrun's WORLD_SIZE",
        )
    )


def _step_tasks(env: Mapping[str, str]) -> tuple[str, int]:
    """The variable holding the srun step's task count, and the count."""
    name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    return name, _int(env, name, 1)


def _slurm(env: Mapping[str, str]) -> Placement:
    """A task of an srun step: rank SLURM_PROCID, the step's tasks, the first node's store."""
    name, world = _step_tasks(env)
    nodes_var = next(
        (v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if v in env),
        None,
    )
    nodes = expand_hostlist(env[nodes_var]) if nodes_var else []
    # this node's place in the step: by name where slurmd gives it, else SLURM_NODEID
    here = env.get("SLURMD_NODENAME")
    node = nodes.index(here) if here in nodes else _int(env, "SLURM_NODEID", 0)
    per_node_var = "SLURM_STEP_TASKS_PER_NODE"
    if per_node_var not in env:
        per_node_var = "SLURM_TASKS_PER_NODE"
    per_node = tasks_per_node(env[per_node_var]) if per_node_var in env else [world]
    if not 0 <= node < len(per_node):
        raise JimuError(
            f"Slurm placed this task on node {node} of a step with {len(per_node)} "
            f"({per_node_var}: {env.get(per_node_var)})"
        )
    addr = env.get("MASTER_ADDR") or (nodes[0] if nodes else None)
    if addr is None:
        raise JimuError(
            "under srun, the step's node list (SLURM_STEP_NODELIST) or MASTER_ADDR must be set"
        )
    step = _int(env, "SLURM_STEP_ID", 0)
    port = _master_port(env, env.get("SLURM_JOB_ID"), step)
    return _checked(
        Placement(
            Launcher.SLURM,
            rank=_int(env, "SLURM_PROCID", 0),
            world=world,
            local_rank=_int(env, "SLURM_LOCALID", 0),
            local_world=per_node[node],
            master_addr=addr,
            master_port=port,
            world_from=f"srun's {name}",
        )
    )


def _mpi(env: Mapping[str, str], prefix: str, local_prefix: str) -> Placement:
    """A rank of mpirun (OpenMPI: ``OMPI_COMM_WORLD_*``) or of a PMI launcher (``PMI_*``,
    with MPICH's ``MPI_LOCALRANKID`` / ``MPI_LOCALNRANKS``)."""
    if prefix == "PMI":
        rank_var, size_var = "PMI_RANK", "PMI_SIZE"
        local_rank_var, local_size_var = "MPI_LOCALRANKID", "MPI_LOCALNRANKS"
        job = env.get("PMI_KVSNAME") or env.get("PMIX_NAMESPACE")
    else:
        rank_var, size_var = f"{prefix}_RANK", f"{prefix}_SIZE"
        local_rank_var, local_size_var = f"{local_prefix}_RANK", f"{local_prefix}_SIZE"
        job = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE")
    world = _int(env, size_var, 1)
    local_world = _int(env, local_size_var, 0)
    addr = env.get("MASTER_ADDR")
    if addr is None:
        if local_world != world:  # rank 0's machine is not in the environment
            raise JimuError(
                f"under an MPI launcher across machines, give rank 0's machine: "
                f"mpirun -x MASTER_ADDR=<host> (ranks: {world}, on this machine: "
                f"{local_world or 'unknown'})"
            )
        addr = "127.0.0.1"
    return _checked(
        Placement(
            Launcher.MPI,
            rank=_int(env, rank_var, 0),
            world=world,
            local_rank=_int(env, local_rank_var, 0),
            local_world=local_world or world,
            master_addr=addr,
            master_port=_master_port(env, job, 0),
            world_from=f"mpirun's {size_var}",
        )
    )


def _master_port(env: Mapping[str, str], job: str | None, step: int) -> int:
    """MASTER_PORT where given, else :func:`job_port` of the job (and step), else torch's 29500."""
    if "MASTER_PORT" in env:
        port = _int(env, "MASTER_PORT", 0)
        if not 0 < port < 65536:
            raise JimuError(f"MASTER_PORT must be a TCP port, 1 to 65535 (MASTER_PORT: {port})")
        return port
    return job_port(job, step) if job else 29500


def job_port(job: str, step: int = 0) -> int:
    """The rendezvous port of a job: ``20000 + (job + step) mod 20000``, a number job id as
    it is, another (an MPI namespace) by its CRC-32.

    Every task computes the same port without talking; jobs 20,000 apart share one, and
    the steps of a job running at once get ports of their own.

    Example:
        >>> job_port("4711"), job_port("4711", step=1), job_port("24711")
        (24711, 24712, 24711)
    """
    number = int(job) if job.isdigit() else zlib.crc32(job.encode())
    return _PORT_BASE + (number + step) % _PORT_SPAN


def _checked(p: Placement) -> Placement:
    if p.world < 1 or not 0 <= p.rank < p.world:
        raise JimuError(f"{p.launcher} gave rank {p.rank} of {p.world} ({p.world_from})")
    if p.local_world < 1 or not 0 <= p.local_rank < p.local_world:
        raise JimuError(
            f"{p.launcher} gave local rank {p.local_rank} of {p.local_world} on this machine"
        )
    return p


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise JimuError(f"{name} must be a whole number ({name}: {value!r})") from None


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """The host names of a Slurm host list, in order: ``node[01-03,07],gpu1`` ->
    ``node01 node02 node03 node07 gpu1``.

    What ``scontrol show hostnames`` prints, without a process or Slurm's tools on the
    node; several bracket groups in one name (``r[1-2]-n[1-2]``) are expanded as Slurm
    does, the rightmost fastest, and zero padding is kept.

    Raises:
        JimuError: unbalanced brackets or a range that is not ``a`` or ``a-b`` with a <= b.

    Example:
        >>> expand_hostlist("node[01-03,07],gpu1")
        ['node01', 'node02', 'node03', 'node07', 'gpu1']
    """
    hosts: list[str] = []
    for name in _split_top(text, text):
        hosts += _expand_name(name, text)
    return hosts


def _split_top(text: str, whole: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if depth not in (0, 1):
            raise JimuError(f"Slurm host list {whole!r} has unbalanced brackets")
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise JimuError(f"Slurm host list {whole!r} has unbalanced brackets")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_name(name: str, whole: str) -> list[str]:
    """One name of a host list with its bracket groups expanded."""
    head, bracket, rest = name.partition("[")
    if not bracket:
        if "]" in name:
            raise JimuError(f"Slurm host list {whole!r} has unbalanced brackets")
        return [name]
    inner, closed, tail = rest.partition("]")
    if not closed:
        raise JimuError(f"Slurm host list {whole!r} has unbalanced brackets")
    values = []
    for part in inner.split(","):
        m = _RANGE.match(part.strip())
        if m is None or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise JimuError(f"Slurm host list {whole!r}: bad range {part!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo)
        values += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return [head + v + t for v in values for t in _expand_name(tail, whole)]


def tasks_per_node(text: str) -> list[int]:
    """The tasks on each node of a step, from Slurm's ``SLURM_STEP_TASKS_PER_NODE``:
    ``2(x3),1`` -> ``[2, 2, 2, 1]``.

    Raises:
        JimuError: a part that is not ``n`` or ``n(xk)``.

    Example:
        >>> tasks_per_node("2(x3),1")
        [2, 2, 2, 1]
    """
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise JimuError(f"Slurm tasks per node {text!r}: bad part {part!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out
