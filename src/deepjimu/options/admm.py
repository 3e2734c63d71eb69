"""pdADMM's options: penalties, quantized exchange, mini-batches, the start, the solvers, the readout.

No torch import here: ``--help`` is built before torch loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from deepjimu.applies import Applies, Condition
from deepjimu.options.base import Group, checker, choice_problems, minimums, option

__all__ = ["AdmmGroup"]

_ADMM_BATCH = Applies(
    when=Condition("--admm-batch > 0", lambda c: c.admm_batch > 0, ("admm_batch",)),
)


@dataclass(frozen=True)
class AdmmGroup(Group):
    """pdADMM's options: penalties, the exchange's quantization, mini-batches, the start,
    the solvers and the readout. ``None``: the model kind's default
    (:func:`deepjimu.strategies.admm.blocks.auto_defaults`)."""

    table: ClassVar[str] = "admm"
    title: ClassVar[str] = "admm"

    rho: float = option(1.0, "penalty of the p = q coupling")
    nu: float = option(1.0, "weight of the layer equations")
    quantize: int = option(
        0,
        "bits of exchanged activations: 0 (off), 8 or 16 (every p and q on a grid, sent as "
        "codes), 4 or 2 (each change of p and q on a grid per sample, sent as packed codes)",
    )
    admm_batch: int = option(0, "mini-batch size (0: full batch)")
    admm_inner: int = option(
        0,
        "iterations per mini-batch (0: twice the number of layers, 4 times for MLPs of 8 "
        "layers or more; 1 per visit with admm-aux keep)",
        applies=_ADMM_BATCH,
    )
    rho_growth: float = option(1.0, "multiply rho by this when the residual stalls")
    admm_tau: float = option(
        1.0,
        "proximal weight of each (W, b) step on ||W - W_old||^2 (larger: slower W)",
    )
    admm_ridge: float | None = option(
        None,
        "relative ridge of every (W, b) step, the ridge of input noise with this "
        "fraction of the layer's mean input variance (0: off)",
        default_text="0.01 for MLPs, 0 for CNNs",
    )
    admm_momentum: float | None = option(
        None,
        "extrapolate every variable but p (and, at quantize 2 and 4, q and u) by this "
        "fraction of its last change (0: off)",
        default_text="0.7 for MLPs, 0.5 for CNNs",
    )
    admm_sweeps: int | None = option(
        None,
        "backward Gauss-Seidel sweeps after each forward start, which carry the labels "
        "to every layer at once (sequential across workers; 0: off)",
        default_text="1 for MLPs, 0 for CNNs",
    )
    admm_init: str = option(
        "auto",
        "start from a forward pass of the model's weights (forward), or first scale each "
        "layer to the first layer's pre-activation RMS on the data (scaled), or each hidden "
        "layer to unit-RMS activations, same network function (unit), or make every square "
        "hidden-to-hidden dense layer the identity, then scale (identity); auto: unit for "
        "CNNs, identity for MLPs of 8 layers or more, else forward",
        choices=("auto", "forward", "scaled", "unit", "identity"),
    )
    admm_memory: float | None = option(
        None,
        "each (W, b) step solves over all batches seen, older ones weighted "
        "by this decay per batch (0: the current batch only)",
        default_text="0.8 for MLPs, 0 for CNNs",
        applies=_ADMM_BATCH,
    )
    admm_aux: str = option(
        "auto",
        "keep each batch's auxiliary variables between visits in files under "
        "TMPDIR, every (W, b) step exact over all samples, the other batches as last visited "
        "(keep; MLPs; a resumed run restarts them from the checkpointed weights), or restart "
        "them from a forward pass at every visit (restart); auto: keep for MLPs without "
        "admm-memory where TMPDIR has room (on a tmpfs, which is memory, a tenth of the "
        "available memory), else restart",
        choices=("auto", "restart", "keep"),
        applies=_ADMM_BATCH,
    )
    admm_readout: str = option(
        "auto",
        "the network evaluated and saved: the iterate's own weights (iterate), the "
        "classifier (last) or every layer (all) refitted by least squares on the inputs the "
        "network's forward pass produces to the iterate's targets z; auto: of the three, the "
        "one with the lowest training loss (full batch and kept mini-batches; restarted "
        "mini-batches use the iterate)",
        choices=("auto", "iterate", "last", "all"),
    )
    admm_cg_iters: int = option(50, "cap on the conjugate-gradient iterations of a conv p-step")

    def problems(self) -> list[str]:
        problems, need = checker()
        for name in ("rho", "nu"):
            value = getattr(self, name)
            need(
                value > 0 and math.isfinite(value),
                f"{name} must be a positive number ({name}: {value})",
            )
        need(  # admm_math.wire.BITS, which this layer sits below
            self.quantize in (0, 2, 4, 8, 16),
            f"quantize must be 0, 2, 4, 8 or 16 (quantize: {self.quantize})",
        )
        problems += minimums(self, {"admm_batch": 0, "admm_inner": 0, "rho_growth": 1})
        for name in ("admm_tau", "admm_ridge"):  # the ridge: None for the model kind's
            value, flag = getattr(self, name), name.replace("_", "-")
            need(
                value is None or (value >= 0 and math.isfinite(value)),
                f"{flag} must be a number >= 0 ({flag}: {value})",
            )
        for name in ("admm_momentum", "admm_memory"):
            value, flag = getattr(self, name), name.replace("_", "-")
            need(value is None or 0 <= value < 1, f"{flag} must be in [0, 1) ({flag}: {value})")
        problems += minimums(self, {"admm_sweeps": 0, "admm_cg_iters": 1})
        return [*problems, *choice_problems(self, AdmmGroup)]
