"""Test helpers: a real Slurm on this machine (munged, slurmctld, slurmd started by hand) and OpenMPI's mpirun.

Debian's packages (``.ci/run`` installs them) will not start their services without
systemd, so :func:`start_slurm` starts each daemon itself with a pid file, as root, in a
folder of its own (config, state, spool, logs, the munge socket) and on free ports, so that
two test processes can each run one; :meth:`Slurm.stop` ends them by those pids. The node
declares more CPUs than the machine has (``config_overrides``): a step of more tasks than
CPUs would otherwise wait forever. Every ``srun``, ``sbatch`` and ``mpirun`` runs under a
timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from processes import env

__all__ = ["PACKAGES", "Slurm", "missing", "mpi_env", "start_slurm", "tasks_of"]

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "openmpi-bin")
_TOOLS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "scontrol", "mpirun")
TIMEOUT = 120  # seconds for any srun, sbatch or mpirun


def missing() -> str | None:
    """One line saying why Slurm and OpenMPI cannot run here, or None."""
    absent = [t for t in _TOOLS if shutil.which(t) is None]
    if absent:
        return (
            f"Slurm and OpenMPI are not installed ({', '.join(absent)} not found): "
            f"apt-get install {' '.join(PACKAGES)} (.ci/run does)"
        )
    if os.geteuid() != 0:
        return "Slurm's daemons are started as root here, and this is not root"
    return None


def mpi_env() -> dict[str, str]:
    """The tests' environment for ``mpirun`` (as root, OpenMPI wants to be told twice)."""
    return {**env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclass
class Slurm:
    """A running Slurm: its folder and the environment its commands need (SLURM_CONF)."""

    root: Path
    env: dict[str, str]

    def run(
        self, argv: list[str], timeout: float = TIMEOUT, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``srun``, ``sbatch``, ``scancel``...) to its end."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)  # fmt: skip

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        """Start a Slurm command in a session of its own."""
        return subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip

    def job_state(self, job: str) -> str:
        """``scontrol show job``'s JobState of ``job`` (RUNNING, PENDING, COMPLETED, ...)."""
        out = self.run(["scontrol", "-o", "show", "job", job], timeout=30).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState", "?")

    def wait_for(self, job: str, states: tuple[str, ...], timeout: float = TIMEOUT) -> str:
        """Wait until ``job`` is in one of ``states``; its state."""
        deadline = time.time() + timeout
        while (state := self.job_state(job)) not in states:
            if time.time() > deadline:
                raise AssertionError(f"job {job} is {state} after {timeout} s, not {states}")
            time.sleep(0.2)
        return state

    def stop(self) -> None:
        """End the daemons by their pid files (SIGTERM, then SIGKILL), remove the folder."""
        pids = []
        for name in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            try:
                pids.append(int((self.root / name).read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        _end(pids)
        shutil.rmtree(self.root, ignore_errors=True)


def _end(pids: list[int], wait_s: float = 10) -> None:
    """SIGTERM to each, then SIGKILL to those alive after ``wait_s``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.time() + wait_s
    while pids and time.time() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_slurm(cpus: int = 8) -> Slurm:
    """Start munged, slurmctld and slurmd for a one-node cluster named after this machine.

    The folder is under /tmp (munged, running as the munge user, must reach its socket:
    pytest's own folders are root's alone). ``cpus`` is what the node declares.
    """
    root = Path(tempfile.mkdtemp(prefix="jimu-slurm-", dir="/tmp"))
    root.chmod(0o755)
    munge = root / "munge"
    munge.mkdir(mode=0o755)
    for d in ("state", "spool", "log"):
        (root / d).mkdir()
    shutil.chown(munge, "munge", "munge")
    slurm = Slurm(root, {**env(), "SLURM_CONF": str(root / "slurm.conf")})
    try:
        _start_daemons(slurm, cpus)
    except BaseException:
        slurm.stop()
        raise
    return slurm


def _start_daemons(slurm: Slurm, cpus: int) -> None:
    root, munge = slurm.root, slurm.root / "munge"
    sock = munge / "munge.socket"
    subprocess.run(
        ["runuser", "-u", "munge", "--", "munged", f"--socket={sock}",
         f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
         f"--seed-file={munge / 'munged.seed'}"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    host = socket.gethostname().split(".")[0]
    ctld, slurmd = _free_ports(2)
    (root / "slurm.conf").write_text(
        f"""\
ClusterName=jimutest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits cred_expire seconds before it starts again (default 120)
AuthInfo=socket={sock},cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
MailProg=/bin/true
ReturnToService=2
KillWait=10
SchedulerParameters=sched_interval=1
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    )
    for daemon in ("slurmctld", "slurmd"):
        r = subprocess.run([daemon], env=slurm.env, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{daemon} did not start: {r.stderr[-2000:]}")
    deadline = time.time() + 30
    while True:
        r = slurm.run(["sinfo", "-h", "-o", "%T"], timeout=10)
        if r.returncode == 0 and r.stdout.strip() == "idle":
            return
        if time.time() > deadline:
            logs = "".join(p.read_text()[-1500:] for p in (root / "log").glob("*.log"))
            raise RuntimeError(f"the node is not idle after 30 s: {r.stdout}{r.stderr}\n{logs}")
        time.sleep(0.2)


def tasks_of(job_name: str) -> list[int]:
    """The deepjimu processes of the Slurm job with this name (by their SLURM_JOB_NAME)."""
    found = []
    key = f"SLURM_JOB_NAME={job_name}".encode()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            environ = (d / "environ").read_bytes().split(b"\0")
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if key in environ and b"deepjimu" in argv and not argv[0].endswith(b"srun"):
            found.append(int(d.name))
    return found
