"""Where a plan's figures come from, and the thread plan under which ``jimu plan`` measures in its own process.

No torch import here: the CLI asks for the thread plan before it imports the plan command,
since OpenMP reads ``OMP_WAIT_POLICY`` once, when torch loads it (:mod:`deepjimu.threads`).
"""

from __future__ import annotations

import argparse

from deepjimu.choices import OmpWait
from deepjimu.threads import ThreadPlan, plan_threads

__all__ = ["measuring_threads", "on_paper"]


def on_paper(cluster_arg: str) -> bool:
    """Whether ``--cluster`` is a TOML file: figures from its device's peaks, nothing measured
    (``probe`` and a ``probe.json`` time the links, and the model's work here).

    Example:
        >>> on_paper("examples/clusters/h100-node.toml"), on_paper("probe")
        (True, False)
    """
    return cluster_arg != "probe" and not cluster_arg.endswith(".json")


def measuring_threads(args: argparse.Namespace) -> ThreadPlan | None:
    """The thread plan of a one-worker ``jimu train`` of the plan's first configuration (the
    first value of a comma list of ``--threads`` or ``--omp-wait``), as that run would make
    it now: the plan's own process measures the model's work under its OpenMP wait policy.

    Returns:
        the plan; None for a plan on paper (nothing is measured) or a bad ``--threads`` or
        ``--omp-wait``, which the plan's validation names in its own line.

    Example:
        >>> args = argparse.Namespace(cluster="probe", omp_wait="passive,default")
        >>> measuring_threads(args).wait
        'passive'
    """
    if on_paper(args.cluster):
        return None
    wait = str(getattr(args, "omp_wait", OmpWait.AUTO)).split(",")[0]
    threads = str(getattr(args, "threads", 0)).split(",")[0]
    if wait not in OmpWait.spellings() or not threads.isdigit():
        return None
    return plan_threads(1, int(threads), wait)
