"""Choices: the closed sets of option values, as str enums spelled as on the command line and in TOML.

No torch import here: the config layer and the thread plan use these before torch loads.
"""

from __future__ import annotations

import enum

__all__ = [
    "Choice",
    "Device",
    "Family",
    "GraphFeatures",
    "KfacMethod",
    "OmpWait",
    "Optimizer",
    "Precision",
    "Schedule",
    "Split",
]


class Choice(str, enum.Enum):
    """A str enum: a member equals, hashes and prints as its spelling.

    So ``cfg.schedule == "1f1b"``, ``{"1f1b": ...}[Schedule.ONE_F_ONE_B]``, JSON and f-strings
    all see ``1f1b``.

    Example:
        >>> f"--schedule {Schedule.ONE_F_ONE_B}", Schedule("1f1b") is Schedule.ONE_F_ONE_B
        ('--schedule 1f1b', True)
    """

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def spellings(cls) -> tuple[str, ...]:
        """Every member's spelling, in declaration order."""
        return tuple(str(m.value) for m in cls)


class Device(Choice):
    """``--device``: where workers compute (auto: CUDA with one GPU per local worker)."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class OmpWait(Choice):
    """``--omp-wait``: OpenMP's idle threads spin (active), sleep (passive) or as OpenMP likes."""

    AUTO = "auto"
    DEFAULT = "default"
    ACTIVE = "active"
    PASSIVE = "passive"


class Precision(Choice):
    """``--precision``: of matmuls (see :mod:`deepjimu.precision`)."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"


class Family(Choice):
    """The kind of a data set, named by its registry entry: options and defaults key on it.

    ``tensors`` is the caller's own data (``deepjimu.fit``), whose kind only the caller knows.
    """

    IMAGES = "images"
    TABULAR = "tabular"
    GRAPH = "graph"
    TEXT = "text"
    TENSORS = "tensors"

    @property
    def noun(self) -> str:
        """As in "graph data": ``image``, ``tabular``, ``graph`` or ``tensor``."""
        return {"images": "image", "tensors": "tensor"}.get(self.value, self.value)


class Split(Choice):
    """``--split``: Planetoid's public split, or a random one of the same sizes."""

    PUBLIC = "public"
    RANDOM = "random"


class GraphFeatures(Choice):
    """``--graph-features``: A_hat^K X alone (as SGC), or every hop side by side (as pdADMM-G)."""

    LAST = "last"
    CONCAT = "concat"


class Optimizer(Choice):
    """``--optimizer`` of the gradient strategies."""

    ADAM = "adam"
    SGD = "sgd"
    KFAC = "kfac"


class LrSchedule(Choice):
    """``--lr-schedule`` of the gradient strategies: a constant rate, or nanoGPT's linear
    warm-up then cosine decay to ``--min-lr``."""

    CONSTANT = "constant"
    COSINE = "cosine"


class Schedule(Choice):
    """``--schedule`` of the pipeline strategy."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class KfacMethod(Choice):
    """``--kfac-method``: eigendecompositions of the K-FAC factors, or damped inverses."""

    EIGEN = "eigen"
    INVERSE = "inverse"
