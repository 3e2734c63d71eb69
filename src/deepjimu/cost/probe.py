"""The probe's record: fitted links, device times, DDP's buckets and the strategies' own steps, as written to ``probe.json``.

Pure, no torch: :mod:`deepjimu.measure.probe` measures it (collectively, over a run's group),
the cost models read it (:mod:`deepjimu.cost.compress`, the planner's cluster), and
``jimu probe`` writes it. Every figure is the slowest rank's, so that every rank holds the
same probe.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deepjimu.atomic import atomic_write_text
from deepjimu.errors import JimuError
from deepjimu.units import format_bytes

__all__ = [
    "SPREAD_TOLERANCE",
    "TIMED_AT_SIZE",
    "LinkFit",
    "Probe",
    "TimedStep",
    "fit_alpha_beta",
    "format_probe",
    "message_key",
    "noisy_points",
    "noisy_repeats",
    "read_probe",
    "relative_spread",
    "write_probe",
]

TIMED_AT_SIZE = ("all_gather",)
"""The collectives whose messages are timed at their own sizes
(:func:`deepjimu.measure.links.time_messages`)."""


@dataclass(frozen=True)
class LinkFit:
    """t(n) = ``alpha_s`` + ``beta_s_per_byte`` * n for a collective with n bytes per rank."""

    alpha_s: float
    beta_s_per_byte: float

    def seconds(self, nbytes: int) -> float:
        """Predicted time of one collective moving ``nbytes`` per rank."""
        return self.alpha_s + self.beta_s_per_byte * nbytes

    @property
    def gbit_per_s(self) -> float:
        """The fitted bandwidth in Gbit/s (inf when the time does not grow with size)."""
        return 8e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")


def fit_alpha_beta(sizes: list[int], seconds: list[float]) -> LinkFit:
    """Fit t = alpha + beta n to measured (n, t) points, minimising the relative error.

    Sizes span four orders of magnitude, so plain least squares would fit the largest
    points only; each equation is divided by its measured time instead. alpha and beta are
    kept >= 0 (a negative one is set to 0 and the other refitted).

    Example:
        >>> f = fit_alpha_beta([1000, 2000, 4000], [0.0011, 0.0012, 0.0014])
        >>> round(f.alpha_s, 6), round(f.beta_s_per_byte * 1e9, 3)
        (0.001, 100.0)

    Raises:
        ValueError: fewer than two points, or a time that is not positive.
    """
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if len(n) < 2 or len(n) != len(t) or not np.all(t > 0):
        raise ValueError(
            f"need >= 2 points with positive times (sizes: {sizes}, seconds: {seconds})"
        )
    a = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    b = np.ones_like(t)
    alpha, beta = np.linalg.lstsq(a, b, rcond=None)[0]
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(n / t) / np.sum((n / t) ** 2))
    elif beta < 0:
        alpha, beta = float(np.sum(1 / t) / np.sum(1 / t**2)), 0.0
    return LinkFit(float(alpha), float(beta))


@dataclass(frozen=True)
class TimedStep:
    """A strategy's own training step as the probe timed it (its ``train_step``, back to back,
    over the probed group): ``step_s`` seconds, the model cut into stages of ``sizes`` blocks
    (empty where the strategy does not cut it), ``rows`` of a micro-batch (of the batch where
    it does not micro-batch) and ``microbatches`` per step."""

    step_s: float
    sizes: list[int] = field(default_factory=list)
    rows: int = 0
    microbatches: int = 1


@dataclass
class Probe:
    """What the probe (:func:`deepjimu.measure.probe.measure`) found on a group and device
    (all times in seconds).

    ``links``: the fit per collective; ``points``: its measured (bytes per rank, seconds);
    ``compute_s``: one training step without communication; ``codec_s``: per option, the
    encode/decode time one step adds (with this ``world``); ``buckets``: the gradient
    shapes of each DDP bucket; ``message_s``: the measured time of each all-gather the
    probed options make (:data:`TIMED_AT_SIZE`), keyed ``"collective:bytes"``
    (:func:`message_key`); ``steps``: per strategy (its registry name) that the probe times,
    its own step over the probed group (:class:`TimedStep`; none with one rank). From a
    split strategy's step the planning layer solves its runtime's own cost per action
    (:attr:`deepjimu.cost.cluster.Cluster.action_s`); from a data-parallel step, what its
    all-reduce costs beyond its fitted time when the ranks reach it at different moments
    (:attr:`deepjimu.cost.cluster.Cluster.ddp_sync_s`). ``compute_rounds_s``: the plain
    step of each timed round, whose median is ``compute_s`` (empty in a probe file of an
    earlier version).
    """

    world: int
    device: str
    model: str
    batch_per_rank: int
    compute_s: float
    codec_s: dict[str, float]
    links: dict[str, LinkFit]
    points: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    buckets: list[list[list[int]]] = field(default_factory=list)
    message_s: dict[str, float] = field(default_factory=dict)
    steps: dict[str, TimedStep] = field(default_factory=dict)
    compute_rounds_s: list[float] = field(default_factory=list)

    def noisy_step(self) -> str | None:
        """One line where the rounds of the plain step disagree past
        :data:`SPREAD_TOLERANCE` (:func:`noisy_repeats`); None where they agree."""
        what = f"the probe's plain step ({self.world} worker(s), {self.batch_per_rank} rows each)"
        return noisy_repeats(what, self.compute_rounds_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Probe:
        fields = {**d, "links": {k: LinkFit(**v) for k, v in d["links"].items()}}
        fields["points"] = {k: [tuple(p) for p in v] for k, v in d.get("points", {}).items()}
        fields["steps"] = {k: TimedStep(**v) for k, v in d.get("steps", {}).items()}
        return cls(**{k: fields[k] for k in cls.__dataclass_fields__ if k in fields})


def write_probe(
    probe: Probe, path: Path, predictions: list[Any] | None = None, choice: str | None = None
) -> None:
    """Write ``probe`` (and the cost model's predictions and choice, when given) to ``path`` atomically."""
    out = probe.to_dict()
    if predictions is not None:
        out["predictions"] = [asdict(p) for p in predictions]
        out["choice"] = choice
    atomic_write_text(path, json.dumps(out, indent=2))


def read_probe(path: Path) -> Probe:
    """The probe written by :func:`write_probe`.

    Raises:
        JimuError: the file is missing or damaged.
    """
    try:
        return Probe.from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise JimuError(f"probe file {path} does not exist; run jimu probe first") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise JimuError(f"probe file {path} is damaged: {e}") from None


def message_key(collective: str, nbytes: int) -> str:
    """The key of one message in :attr:`Probe.message_s`."""
    return f"{collective}:{nbytes}"


NOISE_FACTOR = 2.0
"""A collective timed more than this many times slower than one of a larger payload is
noise (another task took the cores), not the link: its fit is not to be trusted."""


def noisy_points(kind: str, points: list[tuple[int, float]]) -> str | None:
    """One line where ``kind``'s timings contradict themselves: a payload that took more than
    :data:`NOISE_FACTOR` times as long as a larger one; None where they do not.

    Example:
        >>> noisy_points("all_reduce", [(4096, 3.99e-3), (65536, 3.74e-4)])[:61]
        'all_reduce took 3.99 ms for 4.0 KB but 0.374 ms for 64.0 KB: '
        >>> noisy_points("all_reduce", [(4096, 1e-4), (65536, 3e-4)]) is None
        True
    """
    for i, (n, t) in enumerate(points):
        for m, u in points[i + 1 :]:
            if m > n and t > NOISE_FACTOR * u:
                return (
                    f"{kind} took {t * 1e3:.3g} ms for {format_bytes(n)} but {u * 1e3:.3g} ms "
                    f"for {format_bytes(m)}: the timings are noisy (another task had the "
                    "cores), so its fitted latency and bandwidth may be far off; probe again "
                    "on a quieter machine"
                )
    return None


SPREAD_TOLERANCE = 0.5
"""Repeats of one measurement that spread by more than this fraction of their median
((slowest - fastest) / median) are noise (another task took the cores part of the time),
not the work: a prediction from their median may be far off."""


def relative_spread(seconds: Sequence[float]) -> float:
    """How far repeated timings spread: (slowest - fastest) / median (0 for fewer than two).

    Example:
        >>> round(relative_spread([0.010, 0.011, 0.012]), 3)
        0.182
    """
    if len(seconds) < 2:
        return 0.0
    median = statistics.median(seconds)
    return (max(seconds) - min(seconds)) / median if median > 0 else 0.0


def noisy_repeats(what: str, seconds: Sequence[float]) -> str | None:
    """One line where the repeated timings of ``what`` spread past :data:`SPREAD_TOLERANCE`;
    None where they agree (or there are fewer than two).

    Example:
        >>> noisy_repeats("the step", [0.010, 0.011, 0.025])[:59]
        'the step took 10 to 25 ms over 3 repeats: a spread of 136% '
        >>> noisy_repeats("the step", [0.010, 0.011, 0.012]) is None
        True
    """
    spread = relative_spread(seconds)
    if spread <= SPREAD_TOLERANCE:
        return None
    return (
        f"{what} took {min(seconds) * 1e3:.3g} to {max(seconds) * 1e3:.3g} ms over "
        f"{len(seconds)} repeats: a spread of {spread:.0%} of its median (tolerance "
        f"{SPREAD_TOLERANCE:.0%}), the timings are noisy (another task had the cores), so "
        "what is predicted from it may be far off; measure again on a quieter machine"
    )


def format_probe(probe: Probe) -> str:
    """A short table of the probe's fits and device times."""
    lines = [
        f"probe: {probe.world} worker(s) on {probe.device}, {probe.model}, {probe.batch_per_rank} rows per worker"
    ]
    lines.append(
        f"{'collective':<16}{'latency':>12}{'bandwidth':>16}   measured (per-rank payload: time)"
    )
    for kind, fit in probe.links.items():
        pts = ", ".join(
            f"{format_bytes(n)}: {t * 1e3:.3g} ms" for n, t in probe.points.get(kind, [])
        )
        lines.append(
            f"{kind:<16}{fit.alpha_s * 1e6:>9.0f} us{fit.gbit_per_s:>11.3g} Gbit/s   {pts}"
        )
    for kind in probe.links:
        noisy = noisy_points(kind, probe.points.get(kind, []))
        if noisy:
            lines.append(f"warning: {noisy}")
    if probe.message_s:
        lines.append(f"messages timed at their own sizes: {len(probe.message_s)}")
    lines.append(f"compute per step: {probe.compute_s * 1e3:.2f} ms")
    noisy = probe.noisy_step()
    if noisy:
        lines.append(f"warning: {noisy}")
    codec = ", ".join(f"{o} {s * 1e3:.2f} ms" for o, s in probe.codec_s.items() if o != "none")
    lines.append(f"encode/decode per step: {codec}")
    return "\n".join(lines)
