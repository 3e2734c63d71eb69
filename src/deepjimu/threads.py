"""Threads and OpenMP waiting per worker, chosen from how many processes share the cores.

No torch import here: OpenMP reads ``OMP_WAIT_POLICY`` once, when torch loads it, so the
policy of a process must be in its environment before ``import torch``. The launcher puts
it into the environment of the workers it starts; under torchrun the CLI sets it before it
imports torch.

The rule (measured per strategy and worker count; BENCHMARKS.md section 2, "Threads"):

- workers x threads <= cores: leave OpenMP's own default (idle threads spin briefly, then
  sleep). Forcing ``PASSIVE`` made single-process backprop up to 2x slower; forcing
  ``ACTIVE`` made every multi-worker run slower.
- workers x threads > cores (more busy threads than cores): ``PASSIVE``, so a waiting thread
  yields its core to a worker that has work (pdADMM iterations ran 13x slower with spinning
  threads sharing two cores).
- Other work counts too: the threads runnable on the machine when the run starts (other
  programs, other users; not those at a higher nice value) are added to workers x threads. A spinning thread whose partner
  was preempted burns its slice for nothing: ``local`` on digits took 74-81 s with OpenMP's
  default and 27-28 s with ``PASSIVE`` while other jobs kept the 2 cores busy (2 s quiet).

An explicit ``--omp-wait`` or ``--threads`` wins, then ``OMP_WAIT_POLICY`` /
``OMP_NUM_THREADS`` from the user's environment, then the rule.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from deepjimu.choices import OmpWait

__all__ = [
    "SPEED_ENV",
    "ThreadPlan",
    "available_cores",
    "busy_elsewhere",
    "plan_threads",
    "scoped_env",
    "set_env",
    "speed_env",
]

# environment variables that change how fast a worker computes or communicates
SPEED_ENV = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "OMP_DYNAMIC",
    "KMP_BLOCKTIME",
    "KMP_AFFINITY",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset or a cpuset)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def busy_elsewhere(samples: int = 5, interval_s: float = 0.01) -> int:
    """Threads runnable on this machine now, outside this process, that compete with it (0
    where unknown).

    Counted from ``/proc/<pid>/task/<tid>/stat`` (state R), leaving out threads with a
    higher nice value than ours: the scheduler gives those only what we leave idle. The
    smallest of a few samples, so that a passing blip does not count; the load averages
    would remember jobs that have just ended.
    """
    found = []
    for i in range(samples):
        n = _runnable_threads()
        if n is None:
            return 0
        found.append(n)
        if i + 1 < samples:
            time.sleep(interval_s)
    return min(found)


def _runnable_threads() -> int | None:
    """Runnable threads of other processes at our nice value or below; None without /proc."""
    me, mine = os.getpid(), os.nice(0)
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    count = 0
    for pid in pids:
        if pid == me:
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone, or not ours to read
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # after the name: state is field 3 of stat(5), nice field 19
            if fields[0] == "R" and int(fields[16]) <= mine:
                count += 1
    return count


@dataclass(frozen=True)
class ThreadPlan:
    """How each of ``processes`` workers on this machine uses its ``cores``.

    ``wait`` is the OpenMP wait policy: ``default`` (OpenMP's own: spin briefly, then
    sleep), ``active`` or ``passive``; ``source`` says where each choice came from;
    ``busy`` the other tasks that were runnable on the machine when the plan was made.
    """

    threads: int
    wait: str
    processes: int
    cores: int
    source: str
    busy: int = 0

    @property
    def oversubscribed(self) -> bool:
        """More busy threads (ours and the machine's other runnable tasks) than cores."""
        return self.processes * self.threads + self.busy > self.cores

    def env(self) -> dict[str, str | None]:
        """The environment a worker must start with (None: the variable must be unset)."""
        return {
            "OMP_NUM_THREADS": str(self.threads),
            "OMP_WAIT_POLICY": None if self.wait == "default" else self.wait.upper(),
        }

    def matches(self, environ: Mapping[str, str]) -> bool:
        """True if a process started with ``environ`` already has this OpenMP wait policy."""
        want = self.env()["OMP_WAIT_POLICY"]
        have = environ.get("OMP_WAIT_POLICY")
        return (have or "").upper() == (want or "")

    def describe(self) -> str:
        """One line, e.g. ``3 workers x 1 thread on 2 cores (oversubscribed): OpenMP wait passive``."""
        over = f", {self.busy} other busy" if self.busy else ""
        over += ", oversubscribed" if self.oversubscribed else ""
        s = "s" if self.threads > 1 else ""
        w = "s" if self.processes > 1 else ""
        c = "s" if self.cores > 1 else ""
        return (
            f"{self.processes} worker{w} x {self.threads} thread{s} on {self.cores} core{c}{over}: "
            f"OpenMP wait {self.wait} ({self.source})"
        )

    def record(self) -> dict[str, object]:
        """What summary.json keeps of the plan and the speed-relevant environment."""
        return {
            "threads_per_worker": self.threads,
            "omp_wait": self.wait,
            "workers_on_machine": self.processes,
            "cores": self.cores,
            "busy_elsewhere": self.busy,
            "source": self.source,
        }


def plan_threads(
    processes: int,
    threads: int = 0,
    wait: str = OmpWait.AUTO,
    cores: int | None = None,
    environ: Mapping[str, str] | None = None,
    busy: int | None = None,
) -> ThreadPlan:
    """The thread plan for ``processes`` workers sharing this machine.

    Args:
        processes: worker processes on this machine (local workers, or torchrun's
            LOCAL_WORLD_SIZE).
        threads: ``--threads`` (0: ``OMP_NUM_THREADS`` from ``environ`` if set, else
            cores // processes).
        wait: ``--omp-wait``: auto, default, active or passive.
        cores: cores available (default: this process's CPU affinity).
        environ: the user's environment (default: ``os.environ``).
        busy: other tasks runnable on the machine (default: :func:`busy_elsewhere`, read
            only when the rule decides the wait policy).

    Returns:
        the plan; see the module docstring for the rule.

    Raises:
        ValueError: ``processes`` < 1, ``threads`` < 0 or an unknown ``wait``.

    Example:
        >>> plan_threads(3, cores=2, busy=0).wait
        'passive'
        >>> plan_threads(1, cores=2, busy=0).wait
        'default'
        >>> plan_threads(1, cores=2, busy=1).wait
        'passive'
    """
    if processes < 1 or threads < 0 or wait not in OmpWait.spellings():
        raise ValueError(
            f"bad thread plan request (processes: {processes}, threads: {threads}, wait: {wait!r})"
        )
    env = os.environ if environ is None else environ
    cores = cores or available_cores()
    sources = []
    if threads:
        sources.append("threads: --threads")
    elif env.get("OMP_NUM_THREADS", "").isdigit() and int(env["OMP_NUM_THREADS"]) >= 1:
        threads = int(env["OMP_NUM_THREADS"])
        sources.append("threads: OMP_NUM_THREADS")
    else:
        threads = max(1, cores // processes)
        sources.append("threads: cores / workers")
    if wait != OmpWait.AUTO:
        sources.append("wait: --omp-wait")
    elif env.get("OMP_WAIT_POLICY", "").lower() in ("active", "passive"):
        wait = env["OMP_WAIT_POLICY"].lower()
        sources.append("wait: OMP_WAIT_POLICY")
    else:
        busy = busy_elsewhere() if busy is None else busy
        wait = "passive" if processes * threads + busy > cores else "default"
        sources.append("wait: rule")
    return ThreadPlan(threads, wait, processes, cores, ", ".join(sources), busy or 0)


def set_env(changes: Mapping[str, str | None]) -> None:
    """Set environment variables; None unsets one."""
    for k, v in changes.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def scoped_env(changes: Mapping[str, str | None]) -> Iterator[None]:
    """:func:`set_env` for the block, then the old values back.

    Processes started inside the block inherit the changed environment.
    """
    saved = {k: os.environ.get(k) for k in changes}
    try:
        set_env(changes)
        yield
    finally:
        set_env(saved)


def speed_env() -> dict[str, str]:
    """The variables of :data:`SPEED_ENV` that are set in this process's environment."""
    return {k: os.environ[k] for k in SPEED_ENV if k in os.environ}
