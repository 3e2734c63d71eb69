"""The option groups of a run: run, data, optimiser, pipeline, admm, K-FAC and ddp sync.

Each group is a frozen dataclass that declares its options (help, choices, where each
applies: :mod:`deepjimu.applies`) and checks its own values (:meth:`Group.problems`). The
groups are the only place an option is written down: :class:`~deepjimu.config.RunConfig`
is all of them together; the CLI's flags come out of them, each group a section of
``--help``; a TOML file's table (``[admm]``) holds the options of the group of that name.

A strategy declares the groups it takes as their composition (``AdmmOptions(AdmmGroup,
RunGroup)``, defined below, next to each other so that one screen shows who takes what; the
strategy's ``options``), and is handed only those (:func:`narrow`): it cannot read an
option of a group it did not declare, and
``tests/test_options.py`` checks that every option that applies to a strategy is in one
of its groups. No torch import here: ``--help`` is built before torch loads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from deepjimu.applies import EVERYWHERE, Applies, Condition
from deepjimu.choices import (
    Choice,
    Device,
    Family,
    GraphFeatures,
    KfacMethod,
    OmpWait,
    Optimizer,
    Precision,
    Schedule,
    Split,
)
from deepjimu.options.compress import compress_problems

__all__ = [
    "GRADIENT_STRATEGIES",
    "GROUPS",
    "AdmmGroup",
    "AdmmOptions",
    "DataGroup",
    "DdpOptions",
    "GradientOptions",
    "Group",
    "KfacGroup",
    "LocalOptions",
    "OptimGroup",
    "PipelineGroup",
    "PipelineOptions",
    "RunGroup",
    "SyncGroup",
    "applies_of",
    "group_of",
    "narrow",
]

# where options apply (deepjimu.applies): one declaration per field, next to its help; a
# field that names no strategies applies to those that take its group (applies_of)
GRADIENT_STRATEGIES = ("local", "ddp", "model-parallel", "pipeline")
_ADMM_BATCH = Applies(
    when=Condition("--admm-batch > 0", lambda c: c.admm_batch > 0, ("admm_batch",)),
)
_KFAC = Applies(
    when=Condition("--optimizer kfac", lambda c: c.optimizer == Optimizer.KFAC, ("optimizer",)),
)


def _ddp_compress(*kinds: str) -> Applies:
    """ddp with one of these compressors (``auto`` may pick any of them)."""
    names = (*kinds, "auto")
    text = f"{', '.join(names[:-1])} or {names[-1]}"
    return Applies(
        when=Condition(
            f"--compress {text}", lambda c: c.compress.split(":")[0] in names, ("compress",)
        ),
    )


_GRAPH = Applies(data=(Family.GRAPH,))
_PLANETOID = Applies(data=("cora", "citeseer", "pubmed"))
_SYNTHETIC = Applies(data=("synthetic", "sbm", "bow"))
_SBM = Applies(data=("sbm",))
# the data sets whose files --download fetches (digits comes with scikit-learn,
# landsat-spectra with spyndex)
_FETCHED = Applies(
    data=(
        "mnist",
        "fashion-mnist",
        "kmnist",
        "cifar10",
        "cora",
        "citeseer",
        "pubmed",
        "eurosat",
        "eurosat-ms",
        "indian-pines",
        "pavia-u",
    )
)
# remote sensing (issue 33): data sets split per class by a training share
_SCENES = ("indian-pines", "pavia-u")
_PER_CLASS = Applies(data=("eurosat", "eurosat-ms", *_SCENES, "landsat-spectra"))


def _opt(
    default: Any,
    help: str,
    choices: tuple[str, ...] | None = None,
    commas: bool = False,
    applies: Applies = EVERYWHERE,
    **kw: Any,
) -> Any:
    # choices: the values of a plain str option; a Choice default brings its enum's instead.
    # commas: a value of this option may itself contain commas (not a list of values)
    # applies: where the option applies (a run elsewhere refuses it when given)
    kind = type(default) if isinstance(default, Choice) else None
    meta = {
        "help": help,
        "choices": kind.spellings() if kind else choices,
        "enum": kind,
        "commas": commas,
        "applies": applies,
    }
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def _checker() -> tuple[list[str], Callable[[bool, str], None]]:
    """A problems list and ``need(ok, msg)``, which adds ``msg`` to it where ``ok`` is false."""
    problems: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    return problems, need


@dataclass(frozen=True)
class Group:
    """An option group: its fields are options; :meth:`problems` checks them.

    ``table``: the TOML table that holds the group's options; ``title``: its ``--help``
    section; ``strategies``: the strategies that take the group (empty: every one).
    An option with a closed set of values holds its :mod:`~deepjimu.choices` member; a
    spelling outside the set stays a string, for :meth:`problems` to name.
    """

    table: ClassVar[str] = ""
    title: ClassVar[str] = ""
    strategies: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            kind = f.metadata.get("enum")
            value = getattr(self, f.name)
            if kind is not None and value in kind.spellings():
                object.__setattr__(self, f.name, kind(value))

    def problems(self) -> list[str]:
        """This group's checks of its own values, one line each (called as
        ``AdmmGroup.problems(cfg)`` on any object that holds the group)."""
        return []

    @classmethod
    def options(cls) -> list[dataclasses.Field[Any]]:
        """The group's own options, in declaration order (none of a composition of groups)."""
        inherited = {
            f.name
            for base in cls.__mro__[1:]
            if dataclasses.is_dataclass(base)
            for f in fields(base)
        }
        return [f for f in fields(cls) if f.name not in inherited]


def _minimums(cfg: Any, lows: dict[str, float]) -> list[str]:
    """``name must be >= low`` for every option of ``lows`` below its minimum (None: unset, fine)."""
    out = []
    for name, low in lows.items():
        value = getattr(cfg, name)
        if value is not None and not value >= low:  # NaN too
            flag = name.replace("_", "-")
            out.append(f"{flag} must be >= {low:g} ({flag}: {value})")
    return out


def _choice_problems(cfg: Any, group: type[Group]) -> list[str]:
    """Every option of ``group`` with a fixed list of choices holds one of them."""
    problems = []
    for f in group.options():
        choices = f.metadata.get("choices")
        value = getattr(cfg, f.name)
        if choices and value not in choices:
            problems.append(
                f"{f.name.replace('_', '-')} must be one of {', '.join(choices)} (got {value!r})"
            )
    return problems


@dataclass(frozen=True)
class RunGroup(Group):
    """What runs where: the strategy, workers, model, epochs, seed, device, threads, the run
    folder, checkpoints, evaluations, restarts and the split of work over workers.

    ``None`` means "the strategy's default" for ``workers``, ``epochs``;
    :func:`deepjimu.validation.validate` fills them in.
    """

    table: ClassVar[str] = "run"
    title: ClassVar[str] = "run"

    strategy: str = _opt("admm", "training strategy")
    workers: int | None = _opt(None, "number of worker processes (default: the strategy's)")
    model: str = _opt("mlp:256x3", "model spec: mlp:WIDTHxDEPTH, cnn:C1-C2-..., lenet, resnet")
    epochs: int | None = _opt(None, "passes over the training data (admm: iterations)")
    name: str | None = _opt(
        None, "run folder name under --runs-dir (default: strategy-dataset-time)"
    )
    runs_dir: str = _opt("runs", "folder that holds run folders")
    seed: int = _opt(0, "one seed for data split, init, shuffling")
    device: Device = _opt(Device.AUTO, "auto, cpu or cuda")
    quiet: bool = _opt(False, "no progress bar")
    threads: int = _opt(
        0,
        "CPU threads per worker (0: OMP_NUM_THREADS if set, else cores / workers on this machine)",
    )
    omp_wait: OmpWait = _opt(
        OmpWait.AUTO,
        "OpenMP idle threads: auto (passive when workers x threads exceed the cores, else "
        "OpenMP's default; OMP_WAIT_POLICY wins if set), default, active or passive",
    )
    precision: Precision = _opt(
        Precision.FP32, "matmul precision: fp32, tf32 (CUDA tensor cores) or bf16 (autocast)"
    )
    checkpoint_every: int = _opt(0, "save a checkpoint every K epochs (0: only at the end)")
    resume: str | None = _opt(None, "run folder to resume from")
    eval_every: int = _opt(1, "evaluate and log every K epochs")
    max_restarts: int = _opt(
        0,
        "after a worker fails, restart all workers up to N times from the latest checkpoint "
        "(under torchrun: give torchrun's own --max-restarts)",
    )
    balance: str = _opt(
        "auto",
        "work per worker: auto (speed when the fastest worker measures more than 1.1x the "
        "slowest, else even), even (the strategy's own split: stages by time, admm by its cost "
        "estimate, ddp equal shards), speed (that split weighted by each worker's measured "
        "speed); stages also: time, size or N,N,...",
        commas=True,
        applies=Applies(strategies=("model-parallel", "pipeline", "admm", "ddp")),
    )
    emulate_speeds: str = _opt(
        "",
        "one factor in (0, 1] per worker, e.g. 1,0.3: each worker runs in a CPU cgroup with "
        "that share of its threads' CPU time (root; a rehearsal of a mixed cluster)",
        commas=True,
    )

    def problems(self) -> list[str]:
        problems = _minimums(
            self,
            {"workers": 1, "epochs": 1, "checkpoint_every": 0, "threads": 0, "max_restarts": 0,
             "eval_every": 1},
        )  # fmt: skip
        if self.name is not None and (
            self.name in ("", ".", "..") or "/" in self.name or "\\" in self.name
        ):
            problems.append(f"name must be a plain folder name (name: {self.name!r})")
        return [*problems, *_choice_problems(self, RunGroup)]


@dataclass(frozen=True)
class DataGroup(Group):
    """The data set, its split and preparation; synthetic, graph and remote-sensing data."""

    table: ClassVar[str] = "data"
    title: ClassVar[str] = "data"

    dataset: str = _opt("digits", "dataset name")
    data_dir: str = _opt("data", "folder with dataset files")
    download: bool = _opt(
        False, "fetch missing dataset files (checksums verified)", applies=_FETCHED
    )
    data_url: str | None = _opt(None, "base URL of a mirror for --download", applies=_FETCHED)
    val_fraction: float = _opt(
        0.1,
        "fraction of the training set held out for validation",
        # Planetoid's public and random splits have their own validation nodes
        applies=Applies(data=(Family.IMAGES, Family.TABULAR, Family.TENSORS, "sbm")),
    )
    downsample: int = _opt(
        1,
        "average-pool images by this factor per side (2: 28x28 -> 14x14)",
        applies=Applies(data=(Family.IMAGES, Family.TENSORS)),
    )
    classes: list[int] | None = _opt(None, "keep only these classes, e.g. 0,1")
    normalize: bool = _opt(False, "standardise features with the training mean and std")
    synthetic_n: int = _opt(10000, "number of samples (train + test)", applies=_SYNTHETIC)
    synthetic_features: int = _opt(
        196, "number of input features (bow: the vocabulary)", applies=_SYNTHETIC
    )
    synthetic_classes: int = _opt(10, "number of classes", applies=_SYNTHETIC)
    train_fraction: float | None = _opt(
        None,
        "share of each class's samples that trains, the rest tests (default: the data set's: "
        "indian-pines, pavia-u 0.1; eurosat, eurosat-ms 0.8; landsat-spectra 0.5)",
        applies=_PER_CLASS,
    )
    patch: int = _opt(
        0,
        "0: each pixel's spectrum as a vector (MLPs); K (odd): the K x K window around it "
        "as bands x K x K (CNNs)",
        applies=Applies(data=_SCENES),
    )
    split: Split = _opt(
        Split.PUBLIC,
        "Planetoid's public split (20 per class / 500 / 1,000) or random (same sizes, by --seed)",
        applies=_PLANETOID,
    )
    graph_hops: int = _opt(2, "propagation steps K (features A_hat^k X, k <= K)", applies=_GRAPH)
    graph_features: GraphFeatures = _opt(
        GraphFeatures.LAST,
        "last (A_hat^K X, as SGC) or concat ([X, A_hat X, ..., A_hat^K X], as pdADMM-G)",
        applies=_GRAPH,
    )
    graph_row_norm: bool = _opt(True, "scale each node's features to sum 1 first", applies=_GRAPH)
    sbm_degree: float = _opt(10.0, "average node degree (nodes: --synthetic-n)", applies=_SBM)
    sbm_homophily: float = _opt(0.8, "fraction of edges inside a class", applies=_SBM)

    def problems(self) -> list[str]:
        problems, need = _checker()
        need(
            0 <= self.val_fraction < 1,
            f"val-fraction must be in [0, 1) (val-fraction: {self.val_fraction})",
        )
        problems += _minimums(self, {"downsample": 1})
        need(
            self.train_fraction is None or 0 < self.train_fraction < 1,
            f"train-fraction must be in (0, 1) (train-fraction: {self.train_fraction})",
        )
        need(
            self.patch == 0 or (self.patch > 0 and self.patch % 2 == 1),
            f"patch must be 0 or an odd window size (patch: {self.patch})",
        )
        problems += _minimums(
            self, {"synthetic_n": 10, "synthetic_features": 1, "synthetic_classes": 2}
        )
        if self.classes is not None:
            need(
                len(self.classes) >= 2,
                f"classes must name at least 2 classes (classes: {self.classes})",
            )
            need(
                len(set(self.classes)) == len(self.classes),
                f"classes must not repeat (classes: {self.classes})",
            )
        return [*problems, *self._graph_problems(), *_choice_problems(self, DataGroup)]

    def _graph_problems(self) -> list[str]:
        """The graph options (issue 10): hops, and the synthetic SBM graph's degree and homophily."""
        problems, need = _checker()
        problems += _minimums(self, {"graph_hops": 0})
        need(
            0 < self.sbm_degree < self.synthetic_n - 1,
            f"sbm-degree must be > 0 and below synthetic-n - 1 (sbm-degree: {self.sbm_degree}, "
            f"synthetic-n: {self.synthetic_n})",
        )
        need(
            0 <= self.sbm_homophily <= 1,
            f"sbm-homophily must be in [0, 1] (sbm-homophily: {self.sbm_homophily})",
        )
        return problems


@dataclass(frozen=True)
class OptimGroup(Group):
    """The gradient strategies' optimiser: batch size, optimizer, learning rate, momentum, decay.

    ``None`` means "the optimizer's default" for ``lr`` (:data:`deepjimu.config.DEFAULT_LR`).
    """

    table: ClassVar[str] = "optim"
    title: ClassVar[str] = "optimiser (gradient strategies)"
    strategies: ClassVar[tuple[str, ...]] = GRADIENT_STRATEGIES

    batch_size: int = _opt(64, "global mini-batch size (split over data-parallel workers)")
    optimizer: Optimizer = _opt(
        Optimizer.ADAM,
        "optimizer of gradient strategies",
        applies=Applies(values=(("kfac", Applies(strategies=("local", "ddp"))),)),
    )
    lr: float | None = _opt(None, "learning rate (default: 1e-3 adam, 0.05 sgd and kfac)")
    momentum: float = _opt(
        0.9,
        "SGD momentum",
        applies=Applies(
            when=Condition(
                "--optimizer sgd or kfac",
                lambda c: c.optimizer in (Optimizer.SGD, Optimizer.KFAC),
                ("optimizer",),
            ),
        ),
    )
    weight_decay: float = _opt(0.0, "L2 weight decay")

    def problems(self) -> list[str]:
        problems, need = _checker()
        problems += _minimums(self, {"batch_size": 1})
        need(
            self.lr is None or (math.isfinite(self.lr) and self.lr > 0),
            f"lr must be a positive number (lr: {self.lr})",
        )
        need(0 <= self.momentum < 1, f"momentum must be in [0, 1) (momentum: {self.momentum})")
        problems += _minimums(self, {"weight_decay": 0})
        return [*problems, *_choice_problems(self, OptimGroup)]


@dataclass(frozen=True)
class PipelineGroup(Group):
    """The pipeline's schedule and micro-batches."""

    table: ClassVar[str] = "pipeline"
    title: ClassVar[str] = "pipeline"
    strategies: ClassVar[tuple[str, ...]] = ("pipeline",)

    schedule: Schedule = _opt(Schedule.GPIPE, "pipeline schedule")
    microbatches: int = _opt(4, "micro-batches per mini-batch")

    def problems(self) -> list[str]:
        return [*_minimums(self, {"microbatches": 1}), *_choice_problems(self, PipelineGroup)]


@dataclass(frozen=True)
class AdmmGroup(Group):
    """pdADMM's options: penalties, the exchange's quantization, mini-batches, the start,
    the solvers and the readout. ``None``: the model kind's default
    (:func:`deepjimu.strategies.admm.blocks.auto_defaults`)."""

    table: ClassVar[str] = "admm"
    title: ClassVar[str] = "admm"
    strategies: ClassVar[tuple[str, ...]] = ("admm",)

    rho: float = _opt(1.0, "penalty of the p = q coupling")
    nu: float = _opt(1.0, "weight of the layer equations")
    quantize: int = _opt(0, "bits of exchanged activations (0 off, 8 or 16)")
    admm_batch: int = _opt(0, "mini-batch size (0: full batch)")
    admm_inner: int = _opt(
        0,
        "iterations per mini-batch (0: twice the number of layers, 4 times for MLPs of 8 "
        "layers or more; 1 per visit with admm-aux keep)",
        applies=_ADMM_BATCH,
    )
    rho_growth: float = _opt(1.0, "multiply rho by this when the residual stalls")
    admm_tau: float = _opt(
        1.0,
        "proximal weight of each (W, b) step on ||W - W_old||^2 (larger: slower W)",
    )
    admm_ridge: float | None = _opt(
        None,
        "relative ridge of every (W, b) step, the ridge of input noise with this "
        "fraction of the layer's mean input variance (0: off; default 0.01 for MLPs, "
        "0 for CNNs)",
    )
    admm_momentum: float | None = _opt(
        None,
        "extrapolate every variable but p by this fraction of its last change (0: off; "
        "default 0.7 for MLPs, 0.5 for CNNs)",
    )
    admm_sweeps: int | None = _opt(
        None,
        "backward Gauss-Seidel sweeps after each forward start, which carry the labels "
        "to every layer at once (sequential across workers; 0: off; default 1 for MLPs, "
        "0 for CNNs)",
    )
    admm_init: str = _opt(
        "auto",
        "start from a forward pass of the model's weights (forward), or first scale each "
        "layer to the first layer's pre-activation RMS on the data (scaled), or each hidden "
        "layer to unit-RMS activations, same network function (unit); auto: unit for CNNs, "
        "scaled for MLPs of 8 layers or more, else forward",
        choices=("auto", "forward", "scaled", "unit"),
    )
    admm_memory: float | None = _opt(
        None,
        "each (W, b) step solves over all batches seen, older ones weighted "
        "by this decay per batch (0: the current batch only; default 0.8 for MLPs, 0 for CNNs)",
        applies=_ADMM_BATCH,
    )
    admm_aux: str = _opt(
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
    admm_readout: str = _opt(
        "auto",
        "the network evaluated and saved: the iterate's own weights (iterate), the "
        "classifier (last) or every layer (all) refitted by least squares on the inputs the "
        "network's forward pass produces to the iterate's targets z; auto: of the three, the "
        "one with the lowest training loss (full batch and kept mini-batches; restarted "
        "mini-batches use the iterate)",
        choices=("auto", "iterate", "last", "all"),
    )
    admm_cg_iters: int = _opt(50, "cap on the conjugate-gradient iterations of a conv p-step")

    def problems(self) -> list[str]:
        problems, need = _checker()
        for name in ("rho", "nu"):
            value = getattr(self, name)
            need(
                value > 0 and math.isfinite(value),
                f"{name} must be a positive number ({name}: {value})",
            )
        need(
            self.quantize in (0, 8, 16), f"quantize must be 0, 8 or 16 (quantize: {self.quantize})"
        )
        problems += _minimums(self, {"admm_batch": 0, "admm_inner": 0, "rho_growth": 1})
        for name in ("admm_tau", "admm_ridge"):  # the ridge: None for the model kind's
            value, flag = getattr(self, name), name.replace("_", "-")
            need(
                value is None or (value >= 0 and math.isfinite(value)),
                f"{flag} must be a number >= 0 ({flag}: {value})",
            )
        for name in ("admm_momentum", "admm_memory"):
            value, flag = getattr(self, name), name.replace("_", "-")
            need(value is None or 0 <= value < 1, f"{flag} must be in [0, 1) ({flag}: {value})")
        problems += _minimums(self, {"admm_sweeps": 0, "admm_cg_iters": 1})
        return [*problems, *_choice_problems(self, AdmmGroup)]


@dataclass(frozen=True)
class KfacGroup(Group):
    """K-FAC's options (issue 12): ``--optimizer kfac``, K-FAC-preconditioned SGD with momentum (KAISA)."""

    table: ClassVar[str] = "kfac"
    title: ClassVar[str] = "K-FAC (--optimizer kfac)"
    strategies: ClassVar[tuple[str, ...]] = ("local", "ddp")

    kfac_factor_every: int = _opt(
        1, "steps between factor updates (A, G all-reduced)", applies=_KFAC
    )
    kfac_inv_every: int = _opt(10, "steps between decompositions of the factors", applies=_KFAC)
    kfac_damping: float = _opt(0.1, "damping gamma added to each factor", applies=_KFAC)
    kfac_kl_clip: float = _opt(
        0.001, "bound on the step's KL estimate (0: no clipping)", applies=_KFAC
    )
    kfac_factor_decay: float = _opt(
        0.95, "running-average weight of the old factors", applies=_KFAC
    )
    kfac_grad_workers: float = _opt(
        1.0,
        "fraction F of workers preconditioning each layer, 1/workers (MEM-OPT) to 1 (COMM-OPT)",
        applies=_KFAC,
    )
    kfac_method: KfacMethod = _opt(
        KfacMethod.EIGEN, "eigen decompositions or damped inverses", applies=_KFAC
    )

    def problems(self) -> list[str]:
        problems, need = _checker()
        problems += _minimums(self, {"kfac_factor_every": 1, "kfac_inv_every": 1})
        need(
            math.isfinite(self.kfac_damping) and self.kfac_damping > 0,
            f"kfac-damping must be a positive number (kfac-damping: {self.kfac_damping})",
        )
        need(
            math.isfinite(self.kfac_kl_clip) and self.kfac_kl_clip >= 0,
            f"kfac-kl-clip must be >= 0 (kfac-kl-clip: {self.kfac_kl_clip})",
        )
        need(
            0 <= self.kfac_factor_decay < 1,
            f"kfac-factor-decay must be in [0, 1) (kfac-factor-decay: {self.kfac_factor_decay})",
        )
        return [*problems, *_choice_problems(self, KfacGroup)]


@dataclass(frozen=True)
class SyncGroup(Group):
    """ddp's gradient synchronisation: compression, local SGD, per-tensor sync plans (deepjimu.compress)."""

    table: ClassVar[str] = "sync"
    title: ClassVar[str] = "ddp gradient sync"
    strategies: ClassVar[tuple[str, ...]] = ("ddp",)

    compress: str = _opt(
        "none",
        "gradient compression: none, fp16, bf16, powersgd[:RANK], topk[:RATIO], "
        "qsgd[:BITS], or auto (probe the link, let the cost model pick)",
    )
    compress_start: int | None = _opt(
        None,
        "plain all-reduce steps before powersgd, topk or qsgd start "
        "(default: a tenth of the run's steps, at least 2)",
        applies=_ddp_compress("powersgd", "topk", "qsgd"),
    )
    error_feedback: bool = _opt(
        True,
        "add what compression left out to the next step's gradient",
        applies=_ddp_compress("powersgd", "topk"),
    )
    warm_start: bool = _opt(
        True,
        "start each step from the last step's P and Q",
        applies=_ddp_compress("powersgd"),
    )
    sync_plan: str = _opt(
        "allreduce",
        "per-tensor gradient synchronisation: allreduce (DDP's buckets), ps (sharded parameter "
        "server: reduce-scatter, all-gather), sfb (Linear weights as sufficient factors), "
        "sparse (sparse embedding gradients as their touched rows), or auto (per tensor the "
        "method the cost model predicts fastest, from a probe of the link); the tensors a "
        "method cannot take are all-reduced",
        choices=("allreduce", "ps", "sfb", "sparse", "auto"),
    )
    local_sgd: int = _opt(
        0,
        "local SGD, average the models every H steps instead of the gradients (0: off)",
    )
    local_sgd_warmup: int | None = _opt(
        None,
        "plain all-reduce steps first (default: a tenth of the run's steps)",
        applies=Applies(
            when=Condition("--local-sgd > 0", lambda c: c.local_sgd > 0, ("local_sgd",)),
        ),
    )

    def problems(self) -> list[str]:
        problems, need = _checker()
        problems.extend(compress_problems(self.compress))
        start = self.compress_start
        problems += _minimums(self, {"compress_start": 0})
        need(
            start is None
            or start >= 2
            or not (self.error_feedback or self.warm_start)
            or not self.compress.startswith(("powersgd", "auto")),
            "compress-start must be >= 2 for powersgd with error feedback or warm start: DDP "
            f"rebuilds its buckets after step 1 (compress-start: {start}, compress: {self.compress})",
        )
        problems += _minimums(self, {"local_sgd": 0, "local_sgd_warmup": 0})
        need(
            not (self.local_sgd and self.compress != "none"),
            "local-sgd and compress cannot be combined "
            f"(local-sgd: {self.local_sgd}, compress: {self.compress})",
        )
        return [*problems, *_choice_problems(self, SyncGroup)]


# what each strategy takes: the groups it declares, composed (its ``options``)
@dataclass(frozen=True)
class GradientOptions(OptimGroup, RunGroup):
    """What every gradient strategy takes (model-parallel: no more): the run's and the optimiser's."""


@dataclass(frozen=True)
class LocalOptions(KfacGroup, GradientOptions):
    """What local takes: the run's, the optimiser's and K-FAC's options."""


@dataclass(frozen=True)
class DdpOptions(SyncGroup, KfacGroup, GradientOptions):
    """What ddp takes: the run's, the optimiser's, K-FAC's and the gradient sync's options."""


@dataclass(frozen=True)
class PipelineOptions(PipelineGroup, GradientOptions):
    """What pipeline takes: the run's, the optimiser's and the schedule's options."""


@dataclass(frozen=True)
class AdmmOptions(AdmmGroup, RunGroup):
    """What admm takes: the run's options and pdADMM's own."""


GROUPS: tuple[type[Group], ...] = (
    RunGroup,
    DataGroup,
    OptimGroup,
    PipelineGroup,
    AdmmGroup,
    KfacGroup,
    SyncGroup,
)
"""Every option group, in the order of ``--help`` and of a run's saved options."""

G = TypeVar("G", bound=Group)


def narrow(cfg: Any, kind: type[G]) -> G:
    """``kind`` (a group, or a strategy's composition of groups) with ``cfg``'s values of its options.

    Example:
        >>> narrow(AdmmGroup(rho=2.0), AdmmGroup).rho
        2.0
    """
    return kind(**{f.name: getattr(cfg, f.name) for f in fields(kind)})


def applies_of(name: str) -> Applies:
    """Where option ``name`` applies: its own declaration, within the strategies that take
    its group when it names none itself (an admm option applies to admm only, by construction).

    Raises:
        KeyError: no group declares it.
    """
    group = group_of(name)
    own: Applies = next(f for f in group.options() if f.name == name).metadata["applies"]
    if own.strategies or not group.strategies:
        return own
    return dataclasses.replace(own, strategies=group.strategies)


def group_of(name: str) -> type[Group]:
    """The group that declares option ``name``.

    Raises:
        KeyError: no group declares it.
    """
    for group in GROUPS:
        if any(f.name == name for f in group.options()):
            return group
    raise KeyError(name)
