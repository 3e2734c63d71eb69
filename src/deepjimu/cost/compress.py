"""The cost model of ``--compress auto``: every option's step time from a probe, and the rule that picks one.

A step of option o is predicted to take

    compute_s + codec_s[o] + sum over its messages m of (alpha_c + beta_c * bytes_m)

where the messages are what o's comm hook hands to collective c (all-reduce of float32,
float16 or bfloat16, or all-gather of bytes) for each DDP bucket of the probe's layout, and
alpha_c, beta_c are the probe's fit for c: a reduction's time depends on its dtype as well
as its bytes (gloo sums 16-bit floats one element at a time, float16 slower than bfloat16).
Where the probe timed the message itself at its size (``Probe.message_s``), that time
replaces the fit's alpha_c + beta_c * bytes_m. The messages and their prices are the
planning layer's (:mod:`deepjimu.cost.ddp`, on the probe as a cluster:
:func:`deepjimu.cost.cluster.probed_cluster`, whose ring at the probe's own worker count
is exactly the fit), so ``--compress auto`` and ``jimu plan`` price a step alike.
Communication is assumed not to overlap the backward pass (on CPUs the gradient compute
and gloo share the cores); the prediction is for a step past the compressor's warm-up.

**Choice rule.** Only options whose accuracy cost is small are candidates:
:data:`CANDIDATES`, the settings that end within 1 point of uncompressed ddp on digits in
this project's tests (tests/strategies/test_ddp.py) and that stayed within a point on a
wider model too (mlp:1024x4, 10 epochs: plain 96.9%, powersgd:4 97.2%): 16-bit floats,
QSGD with 8 bits (unbiased), PowerSGD of rank 4 with error feedback and warm start after a
warm-up of plain all-reduce. topk is not a candidate although it passes the digits test
with SGD after 60 epochs (after 30 it was 0.3 to 2.8 points behind, by seed): top-1% lost
12.7 points on mlp:1024x4 after 10 epochs (84.2%, SGD with momentum, which error feedback
alone does not correct; Deep Gradient Compression adds momentum correction for this) and
2.8 points under Adam on mlp:64x2 after 30 epochs; it is probed and predicted
(:data:`PROBED`) so that its prediction can be compared, not chosen. Among the candidates
the fastest predicted one wins, except that an option predicted within
:data:`TIE` (5%) of the fastest is preferred when it comes earlier in :data:`CANDIDATES`,
which lists them from the least to the most lossy: a few percent of predicted time are not
worth more approximation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deepjimu.cost.cluster import probed_cluster
from deepjimu.cost.ddp import message_s
from deepjimu.cost.ddp import messages as step_messages
from deepjimu.cost.probe import Probe, format_probe, write_probe
from deepjimu.errors import JimuError
from deepjimu.units import format_bytes

__all__ = [
    "CANDIDATES",
    "PROBED",
    "TIE",
    "CostModel",
    "Prediction",
    "format_predictions",
    "save_choice",
]

CANDIDATES = ("none", "fp16", "bf16", "qsgd:8", "powersgd:4")
PROBED = (*CANDIDATES, "topk:0.01")
TIE = 0.05


@dataclass(frozen=True)
class Prediction:
    """One option's predicted step (seconds) and the bytes one rank hands to collectives per step."""

    option: str
    step_s: float
    compute_s: float
    codec_s: float
    comm_s: float
    bytes_per_step: int


class CostModel:
    """Predicts the step time of each ``--compress`` option from a :class:`~deepjimu.cost.probe.Probe`.

    Pure: no measurement, no communication, so it can be checked on made-up probes.

    Example:
        >>> model = CostModel(probe)  # doctest: +SKIP
        >>> choice, predictions = model.choose()  # doctest: +SKIP
    """

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.cluster = (
            probed_cluster(probe.links, probe.world, probe.device) if probe.world > 1 else None
        )

    def messages(self, option: str) -> list[tuple[str, int]]:
        """The collectives (name, bytes per rank) that ``option``'s hook makes in one step past its warm-up."""
        try:
            return step_messages(option, self.probe.buckets)
        except ValueError as e:
            raise JimuError(f"the cost model has no messages for {option!r}: {e}") from None

    def predict(self, option: str) -> Prediction:
        """The predicted step of ``option`` past its warm-up.

        Raises:
            JimuError: the probe did not time ``option``'s encode/decode or its collectives
                (a probe file from before the 16-bit reductions were timed).
        """
        if option not in self.probe.codec_s:
            raise JimuError(
                f"the probe has no encode/decode time for {option!r} (probed: {', '.join(self.probe.codec_s)})"
            )
        msgs = self.messages(option)
        missing = sorted({c for c, _ in msgs} - set(self.probe.links))
        if missing:
            raise JimuError(
                f"the probe has no fit for {', '.join(missing)} (fitted: {', '.join(self.probe.links)}); "
                "run jimu probe again"
            )
        comm_s = 0.0
        if self.cluster is not None:
            p, measured = self.probe.world, self.probe.message_s
            comm_s = sum(message_s(self.cluster, c, b, p, measured) for c, b in msgs)
        codec_s = self.probe.codec_s[option]
        return Prediction(
            option=option,
            step_s=self.probe.compute_s + codec_s + comm_s,
            compute_s=self.probe.compute_s,
            codec_s=codec_s,
            comm_s=comm_s,
            bytes_per_step=sum(b for _, b in msgs),
        )

    def choose(self) -> tuple[str, list[Prediction]]:
        """The option the rule picks among :data:`CANDIDATES` (see the module docstring).

        Returns:
            the choice, and the prediction of every option the probe timed.
        """
        predictions = [self.predict(o) for o in self.probe.codec_s]
        steps = {p.option: p.step_s for p in predictions if p.option in CANDIDATES}
        fastest = min(steps.values())
        choice = next(o for o in CANDIDATES if o in steps and steps[o] <= fastest * (1 + TIE))
        return choice, predictions


def format_predictions(predictions: list[Prediction], choice: str) -> str:
    """The cost model's table and its choice, for the run's output."""
    lines = [
        f"{'option':<12}{'step ms':>10}{'compute':>10}{'codec':>10}{'comm':>10}{'sent/step':>12}"
    ]
    for p in predictions:
        mark = "  <- chosen" if p.option == choice else ""
        mark = mark if p.option in CANDIDATES else "  (not a candidate)"
        lines.append(
            f"{p.option:<12}{p.step_s * 1e3:>10.2f}{p.compute_s * 1e3:>10.2f}{p.codec_s * 1e3:>10.2f}"
            f"{p.comm_s * 1e3:>10.2f}{format_bytes(p.bytes_per_step):>12}{mark}"
        )
    lines.append(
        f"compress auto: {choice} (the fastest predicted step among {', '.join(CANDIDATES)}; "
        f"within {TIE:.0%} of it, the less lossy option)"
    )
    return "\n".join(lines)


def save_choice(probe: Probe, choice: str, predictions: list[Prediction], path: Path) -> str:
    """Write ``probe`` with the cost model's ``predictions`` and ``choice`` to ``path``
    (``probe.json``, atomically); the probe's table and the predictions', as printed."""
    write_probe(probe, path, predictions, choice)
    return f"{format_probe(probe)}\n{format_predictions(predictions, choice)}"
