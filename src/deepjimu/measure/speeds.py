"""Each worker's measured speed, and the ``--balance`` it leads to.

At the start of a run of several workers that may balance by speed (``--balance auto`` or
``speed``), every rank runs the same calibration at once: plain training steps of the
run's own model on a few rows, in :data:`WINDOWS` windows of :data:`CALIBRATE_S` seconds
(each spans several periods of a CPU quota, :mod:`deepjimu.emulate`). A rank's rate is its
best window's, and its speed that rate over the fastest rank's (the fastest is 1.0).
``auto`` balances by speed when the slowest is more than :data:`~deepjimu.balance.UNEVEN` slower than the
fastest, and splits evenly (the strategy's own split) otherwise.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from deepjimu.atomic import atomic_write_text
from deepjimu.balance import SPEED_BALANCES, chosen_balance
from deepjimu.emulate import parse_speeds
from deepjimu.measure.blocks import runnable
from deepjimu.measure.timing import timed_s
from deepjimu.run import Run
from deepjimu.threads import ThreadPlan

__all__ = [
    "CALIBRATE_S",
    "SPEEDS_FILE",
    "WINDOWS",
    "balance_speeds",
    "calibrate",
    "emulation_unmet",
    "time_shared",
]

CALIBRATE_S = 0.25
"""Seconds of each calibration window (all ranks at once; 5 periods of an emulated quota)."""

WINDOWS = 2
"""Calibration windows; a rank's rate is its best window's."""


def calibrate(
    model: nn.Module, x: Tensor, y: Tensor, seconds: float = CALIBRATE_S, windows: int = WINDOWS
) -> float:
    """Training steps per second of ``model`` on ``x`` (forward, loss, backward; no
    optimizer, so nothing of the run changes: its gradients are dropped and its buffers,
    a batch norm's running statistics, put back): the best of ``windows`` windows of
    ``seconds`` each. A slow device (or a CPU quota) is slow in every window; another
    task that took the core for a moment slows only one. The model itself is timed, not a
    copy: a copy would hold the whole model's weights once more, where a split model's
    worker has room for little more than them (a model on another device than ``x`` is
    copied there, as the run itself moves only its own part). An ``nn.Sequential`` steps
    one block at a time, each block's gradients dropped before the next (a whole step would
    hold the whole model's gradients too); the rates of the ranks compare alike.
    """
    # a split model's other blocks (on the meta device) are made, one at a time, each step
    here = all(t.device == x.device or t.is_meta for t in model.parameters())
    probe = model if here else copy.deepcopy(model).to(x.device)
    buffers = {name: b.detach().clone() for name, b in probe.named_buffers()}
    devices = [x.device] if x.device.type == "cuda" else []

    def step() -> None:
        if not isinstance(probe, nn.Sequential):
            probe.zero_grad(set_to_none=True)
            F.cross_entropy(probe(x), y).backward()
            return
        inp = x
        for i, held in enumerate(probe):
            block = runnable(held, x.device) if _meta(held) else held
            inp = inp.detach().requires_grad_(inp.is_floating_point())
            out = block(inp)
            last = i == len(probe) - 1
            # a sum's gradient is ones; backward(ones) would import sympy (0.3 s of CPU)
            (F.cross_entropy(out, y) if last else out.sum()).backward()
            block.zero_grad(set_to_none=True)
            inp = out

    best = 0.0
    try:
        with torch.random.fork_rng(devices=devices):
            step()  # warm: allocations, kernels
            for _ in range(windows):
                steps, elapsed = 0, 0.0
                while elapsed < seconds:
                    elapsed += timed_s(step, x.device)
                    steps += 1
                best = max(best, steps / elapsed)
    finally:
        probe.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in probe.named_buffers():
                b.copy_(buffers[name])
    return best


EMULATION_TOLERANCE = 0.25
"""How far a measured speed may be from ``--emulate-speeds``' factor, relative to it, before
the run says the emulation did not take (calibrations of one quota here: within 10%)."""


def emulation_unmet(asked: list[float], measured: list[float]) -> str | None:
    """One line where the measured speeds (relative to the fastest) are not the emulated
    factors (relative to theirs) within :data:`EMULATION_TOLERANCE`: a CPU quota cannot slow
    a worker that the host's load already slows more, and then the emulation does nothing;
    None where they agree.

    Example:
        >>> emulation_unmet([1.0, 0.5], [1.0, 0.52]) is None
        True
        >>> emulation_unmet([1.0, 0.5], [1.0, 0.96])[:58]
        '--emulate-speeds asked for 1.00, 0.50 but the workers ran '
    """
    factors = [*asked, *[1.0] * (len(measured) - len(asked))][: len(measured)]
    want = [f / max(factors) for f in factors]
    if all(abs(m - w) <= EMULATION_TOLERANCE * w for m, w in zip(measured, want, strict=True)):
        return None
    return (
        f"--emulate-speeds asked for {', '.join(f'{w:.2f}' for w in want)} but the workers ran "
        f"at {', '.join(f'{m:.2f}' for m in measured)} (measured): the host's own load slows "
        "them more than the emulated quotas do, so the emulation has little effect; run it on "
        "an idle machine, or with fewer threads (--threads)"
    )


def _meta(block: nn.Module) -> bool:
    return any(t.is_meta for t in block.parameters())


def time_shared(emulate_speeds: str, plan: ThreadPlan, device: torch.device) -> bool:
    """Whether this node's workers (their threads, each at its ``--emulate-speeds`` share)
    and the other tasks runnable when the run started want more of its cores than it has,
    so that the scheduler takes turns among them (``balance_speeds``' ``time_shared``)."""
    if device.type != "cpu":
        return False
    shares = parse_speeds(emulate_speeds) if emulate_speeds else [1.0] * plan.processes
    return sum(shares) * plan.threads + plan.busy > plan.cores


SPEEDS_FILE = "speeds.json"
"""Where rank 0 keeps the measured speeds in the run folder: a resumed run splits the work
as the run it goes on did (a checkpoint's per-rank state fits only that split)."""


def balance_speeds(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    run: Run,
    resumed_from: Path | None = None,
    time_shared: bool = False,
) -> None:
    """Collective: set ``run.balance`` (``auto`` resolved) and ``run.speeds`` (each rank's
    measured speed, where the run balances by speed; else None).

    Ranks calibrate only for ``--balance auto`` or ``speed`` with several workers, on
    ``x``'s first rows (on the rank's device), and rank 0 prints the speeds and writes
    :data:`SPEEDS_FILE`; a run resumed from ``resumed_from`` reads that file instead.
    ``time_shared``: the ranks of a node want more cores than it has, so the scheduler
    takes turns among them; whose turn a short calibration caught is chance (3 workers on
    2 cores measured 0.56-1.0 of each other, at random), not a speed, and ``auto`` splits
    evenly without measuring. ``speed`` still measures and trusts the measurement.
    """
    balance = run.cfg.balance
    if balance not in SPEED_BALANCES or run.world < 2:
        run.balance, run.speeds = chosen_balance(balance, None), None
        return
    kept = resumed_from / SPEEDS_FILE if resumed_from is not None else None
    speeds: list[float] | None
    if kept is not None and kept.exists():  # the split of the run this one goes on
        speeds = json.loads(kept.read_text())["speeds"]
    # every rank decides alike (each node judged its own cores): one time-shared, all even
    elif balance == "auto" and any(run.gather_objects(time_shared)):
        speeds = None
    else:
        rows = min(len(x), 64)
        rate = calibrate(model, x[:rows], y[:rows])
        rates = run.gather_objects(rate)
        speeds = [round(r / max(rates), 4) for r in rates]
    run.balance = chosen_balance(balance, speeds) if speeds is not None else "even"
    run.speeds = speeds if run.balance == "speed" else None
    if run.is_main:
        atomic_write_text(run.out_dir / SPEEDS_FILE, json.dumps({"speeds": speeds}))
        if speeds is not None and not run.cfg.quiet:
            shown = ", ".join(f"{s:.2f}" for s in speeds)
            print(f"worker speeds measured: {shown}; balance: {run.balance}", flush=True)
        if speeds is not None and run.cfg.emulate_speeds:
            unmet = emulation_unmet(parse_speeds(run.cfg.emulate_speeds), speeds)
            if unmet:
                print(f"warning: {unmet}", file=sys.stderr, flush=True)
