"""RunConfig: every option of a run, from flags or a TOML file, validated before any worker starts."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from deepjimu import defaults
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
from deepjimu.compress.spec import compress_problems
from deepjimu.errors import JimuError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "CONFIG_VERSION",
    "DEFAULT_LR",
    "GRADIENT_STRATEGIES",
    "ConfigErrors",
    "RunConfig",
    "add_options",
    "applies_of",
    "field_kind",
    "flag_values",
    "given_options",
    "load_config",
    "option_fields",
    "option_label",
]

# the layout of a run's saved options (config.json, a checkpoint's meta.json): raise it when
# an option is renamed or removed, so that a run saved by another version ends in one line
CONFIG_VERSION = 1

# per --optimizer, when --lr is not given
DEFAULT_LR = {Optimizer.ADAM: 1e-3, Optimizer.SGD: 0.05, Optimizer.KFAC: 0.05}


# where options apply (deepjimu.applies): one declaration per field, next to its help
GRADIENT_STRATEGIES = ("local", "ddp", "model-parallel", "pipeline")
_GRADIENT = Applies(strategies=GRADIENT_STRATEGIES)
_PIPELINE = Applies(strategies=("pipeline",))
_ADMM = Applies(strategies=("admm",))
_ADMM_BATCH = Applies(
    strategies=("admm",),
    when=Condition("--admm-batch > 0", lambda c: c.admm_batch > 0, ("admm_batch",)),
)
_KFAC = Applies(
    strategies=("local", "ddp"),
    when=Condition("--optimizer kfac", lambda c: c.optimizer == Optimizer.KFAC, ("optimizer",)),
)
_DDP = Applies(strategies=("ddp",))


def _ddp_compress(*kinds: str) -> Applies:
    """ddp with one of these compressors (``auto`` may pick any of them)."""
    names = (*kinds, "auto")
    text = f"{', '.join(names[:-1])} or {names[-1]}"
    return Applies(
        strategies=("ddp",),
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


@dataclass
class RunConfig:
    """All options of one training run. Field names are the flags (``--batch-size``) and TOML keys.

    ``None`` means "the strategy's default" for ``workers``, ``epochs`` and ``lr``;
    :func:`deepjimu.validation.validate` fills them in. An option with a closed set of values
    holds its :mod:`~deepjimu.choices` member; a spelling outside the set stays a string,
    for validation to name. Each option's metadata says where it applies
    (:mod:`deepjimu.applies`); ``given``, not an option, names those the user gave
    (:func:`given_options`).
    """

    # what and where
    strategy: str = _opt("admm", "training strategy")
    workers: int | None = _opt(None, "number of worker processes (default: the strategy's)")
    dataset: str = _opt("digits", "dataset name")
    model: str = _opt("mlp:256x3", "model spec: mlp:WIDTHxDEPTH, cnn:C1-C2-..., lenet, resnet")
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
    # data
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
    # remote sensing (issue 33)
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
    # graphs (issue 10): Planetoid split, graph features, stochastic block model
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
    # optimisation (gradient strategies)
    epochs: int | None = _opt(None, "passes over the training data (admm: iterations)")
    batch_size: int = _opt(
        64, "global mini-batch size (split over data-parallel workers)", applies=_GRADIENT
    )
    optimizer: Optimizer = _opt(
        Optimizer.ADAM,
        "optimizer of gradient strategies",
        applies=Applies(
            strategies=GRADIENT_STRATEGIES,
            values=(("kfac", Applies(strategies=("local", "ddp"))),),
        ),
    )
    lr: float | None = _opt(
        None, "learning rate (default: 1e-3 adam, 0.05 sgd and kfac)", applies=_GRADIENT
    )
    momentum: float = _opt(
        0.9,
        "SGD momentum",
        applies=Applies(
            strategies=GRADIENT_STRATEGIES,
            when=Condition(
                "--optimizer sgd or kfac",
                lambda c: c.optimizer in (Optimizer.SGD, Optimizer.KFAC),
                ("optimizer",),
            ),
        ),
    )
    weight_decay: float = _opt(0.0, "L2 weight decay", applies=_GRADIENT)
    # checkpoints and logging
    checkpoint_every: int = _opt(0, "save a checkpoint every K epochs (0: only at the end)")
    resume: str | None = _opt(None, "run folder to resume from")
    eval_every: int = _opt(1, "evaluate and log every K epochs")
    # runs that survive faults
    max_restarts: int = _opt(
        0,
        "after a worker fails, restart all workers up to N times from the latest checkpoint "
        "(under torchrun: give torchrun's own --max-restarts)",
    )
    # pipeline
    schedule: Schedule = _opt(Schedule.GPIPE, "pipeline schedule", applies=_PIPELINE)
    microbatches: int = _opt(4, "micro-batches per mini-batch", applies=_PIPELINE)
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
    # admm
    rho: float = _opt(1.0, "penalty of the p = q coupling", applies=_ADMM)
    nu: float = _opt(1.0, "weight of the layer equations", applies=_ADMM)
    quantize: int = _opt(0, "bits of exchanged activations (0 off, 8 or 16)", applies=_ADMM)
    admm_batch: int = _opt(0, "mini-batch size (0: full batch)", applies=_ADMM)
    admm_inner: int = _opt(
        0,
        "iterations per mini-batch (0: twice the number of layers, 4 times for MLPs of 8 "
        "layers or more; 1 per visit with admm-aux keep)",
        applies=_ADMM_BATCH,
    )
    rho_growth: float = _opt(1.0, "multiply rho by this when the residual stalls", applies=_ADMM)
    admm_tau: float = _opt(
        1.0,
        "proximal weight of each (W, b) step on ||W - W_old||^2 (larger: slower W)",
        applies=_ADMM,
    )
    admm_ridge: float | None = _opt(
        None,
        "relative ridge of every (W, b) step, the ridge of input noise with this "
        "fraction of the layer's mean input variance (0: off; default 0.01 for MLPs, "
        "0 for CNNs)",
        applies=_ADMM,
    )
    admm_momentum: float | None = _opt(
        None,
        "extrapolate every variable but p by this fraction of its last change (0: off; "
        "default 0.7 for MLPs, 0.5 for CNNs)",
        applies=_ADMM,
    )
    admm_sweeps: int | None = _opt(
        None,
        "backward Gauss-Seidel sweeps after each forward start, which carry the labels "
        "to every layer at once (sequential across workers; 0: off; default 1 for MLPs, "
        "0 for CNNs)",
        applies=_ADMM,
    )
    admm_init: str = _opt(
        "auto",
        "start from a forward pass of the model's weights (forward), or first scale each "
        "layer to the first layer's pre-activation RMS on the data (scaled), or each hidden "
        "layer to unit-RMS activations, same network function (unit); auto: unit for CNNs, "
        "scaled for MLPs of 8 layers or more, else forward",
        choices=("auto", "forward", "scaled", "unit"),
        applies=_ADMM,
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
        applies=_ADMM,
    )
    # admm on CNNs (issue 13)
    admm_cg_iters: int = _opt(
        50, "cap on the conjugate-gradient iterations of a conv p-step", applies=_ADMM
    )
    # kfac (issue 12): --optimizer kfac, K-FAC-preconditioned SGD with momentum (KAISA)
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
    # ddp: gradient compression and local SGD (deepjimu.compress)
    compress: str = _opt(
        "none",
        "gradient compression: none, fp16, bf16, powersgd[:RANK], topk[:RATIO], "
        "qsgd[:BITS], or auto (probe the link, let the cost model pick)",
        applies=_DDP,
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
        applies=_DDP,
    )
    local_sgd: int = _opt(
        0,
        "local SGD, average the models every H steps instead of the gradients (0: off)",
        applies=_DDP,
    )
    local_sgd_warmup: int | None = _opt(
        None,
        "plain all-reduce steps first (default: a tenth of the run's steps)",
        applies=Applies(
            strategies=("ddp",),
            when=Condition("--local-sgd > 0", lambda c: c.local_sgd > 0, ("local_sgd",)),
        ),
    )
    # not an option: which options the user gave (given_options), and where
    given: dict[str, str] | None = field(default=None, compare=False, metadata={"option": False})

    def __post_init__(self) -> None:
        for f in fields(self):
            kind = f.metadata.get("enum")
            value = getattr(self, f.name)
            if kind is not None and value in kind.spellings():
                setattr(self, f.name, kind(value))

    def to_dict(self) -> dict[str, Any]:
        """Plain values, suitable for JSON and TOML (a choice's member is a str)."""
        return dataclasses.asdict(self)

    def to_saved(self) -> dict[str, Any]:
        """What a run folder keeps (config.json, a checkpoint): the options and the layout's
        version, :data:`CONFIG_VERSION`."""
        return {"config_version": CONFIG_VERSION, **self.to_dict()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """Build from plain values (as written by :meth:`to_dict`)."""
        return cls(**values)


class ConfigErrors(JimuError):
    """Several config problems, one line each; ``str()`` joins them with newlines."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def option_fields() -> list[dataclasses.Field[Any]]:
    """The options of :class:`RunConfig`, in declaration order (they become the CLI flags)."""
    return [f for f in fields(RunConfig) if f.metadata.get("option", True)]


def applies_of(name: str) -> Applies:
    """Where option ``name`` applies (its declaration)."""
    return {f.name: f for f in option_fields()}[name].metadata["applies"]  # type: ignore[no-any-return]


def given_options(cfg: RunConfig) -> dict[str, str]:
    """The options the user gave for ``cfg``, each with where: ``flag``, ``fit`` or a TOML file.

    The CLI and :func:`deepjimu.fit` record them in ``cfg.given``; for a RunConfig built
    in Python without it, every option whose value differs from its default counts as
    given (by ``flag``).
    """
    if cfg.given is not None:
        return dict(cfg.given)
    own = RunConfig().to_dict()
    return {f.name: "flag" for f in option_fields() if getattr(cfg, f.name) != own[f.name]}


def option_label(name: str, source: str) -> str:
    """How a refusal names option ``name`` given by ``source``: ``--graph-hops``,
    ``fit keyword graph_hops`` or ``run.toml: graph-hops``."""
    if source == "fit":
        return f"fit keyword {name}"
    flag = name.replace("_", "-")
    return f"--{flag}" if source == "flag" else f"{source}: {flag}"


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, exclude: frozenset[str] = frozenset()
) -> None:
    """Add a flag for every :class:`RunConfig` field not in ``exclude`` (``--batch-size``, ...).

    Flags that are not given stay out of the namespace (``argparse.SUPPRESS``), so
    :func:`flag_values` returns only what the user said.
    """
    own = RunConfig().to_dict()
    for f in option_fields():
        if f.name in exclude:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if f.metadata.get("choices"):
            help_text += f" ({'|'.join(f.metadata['choices'])})"
        by_family = defaults.help_text(f.name)  # the family table's, where it sets one
        default = f"default: {own[f.name]}" + (f"; {by_family}" if by_family else "")
        help_text += f" ({_where(f.metadata['applies'])}{default})"
        if field_kind(f) == "bool":
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                default=argparse.SUPPRESS,
                metavar=f.name.upper(),
                help=help_text,
            )


def _where(applies: Applies) -> str:
    """The start of a flag's help parenthesis: ``for strategy admm; `` (nothing: everywhere)."""
    if applies.everywhere:
        return ""
    text = applies.text()
    for value, stricter in applies.values:
        text += f"{'; ' if text else ''}{value}: {stricter.text()}"
    return f"for {text}; "


def flag_values(args: argparse.Namespace, source: str = "flag") -> dict[str, Any]:
    """The :class:`RunConfig` fields present in ``args``, each converted to its type.

    Raises:
        ConfigErrors: one line per value of the wrong type.
    """
    known = {f.name for f in option_fields()}
    problems, values = [], {}
    for name, value in vars(args).items():
        if name not in known:
            continue
        try:
            values[name] = coerce(name, value, source)
        except JimuError as e:
            problems.append(str(e))
    if problems:
        raise ConfigErrors(problems)
    return values


def field_kind(f: dataclasses.Field[Any]) -> str:
    """The value type of a field: ``list[int]``, ``bool``, ``int``, ``float`` or ``str``."""
    t = str(f.type)
    for kind in ("list[int]", "bool", "int", "float"):
        if t.startswith(kind):
            return kind
    return "str"


def coerce(name: str, value: Any, source: str) -> Any:
    """Convert ``value`` (a flag string or a TOML value) to the type of field ``name``.

    Raises:
        JimuError: one line naming the source, the field and the bad value.
    """
    f = {f.name: f for f in option_fields()}[name]
    kind = field_kind(f)
    if value is None:
        return None
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind == "list[int]":
            items = value if isinstance(value, list) else str(value).split(",")
            return [int(v) for v in items if str(v).strip() != ""]
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        want = _KIND_WORDS[kind]
        raise JimuError(
            f"{source}: {name.replace('_', '-')} must be {want} (got {value!r})"
        ) from None


_KIND_WORDS = {
    "bool": "true or false",
    "int": "a whole number",
    "float": "a number",
    "list[int]": "a list of whole numbers",
    "str": "text",
}


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into field values; keys may use ``-`` or ``_``.

    Tables such as ``[admm]`` are accepted and flattened (their keys are plain options).

    Raises:
        JimuError: missing or unreadable file, bad TOML, unknown key, wrong type.
    """
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise JimuError(f"config file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise JimuError(f"config file {p} cannot be read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise JimuError(f"config file {p} is not valid TOML: {e}") from None
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    known = {f.name for f in option_fields()}
    out: dict[str, Any] = {}
    problems = []
    for key, value in flat.items():
        name = key.replace("-", "_")
        if name not in known:
            problems.append(f"{p}: unknown option {key!r}")
            continue
        try:
            out[name] = coerce(name, value, str(p))
        except JimuError as e:
            problems.append(str(e))
    if problems:
        raise ConfigErrors(problems)
    return out


def load_config(flag_values: dict[str, Any], config_file: str | None = None) -> RunConfig:
    """Merge defaults < TOML file < flags into a :class:`RunConfig` (not yet validated).

    Args:
        flag_values: only the options given on the command line, already typed.
        config_file: optional TOML path.
    """
    values: dict[str, Any] = {}
    if config_file:
        values.update(read_toml(config_file))
    values.update(flag_values)
    return RunConfig(**values)


def basic_problems(cfg: RunConfig) -> list[str]:
    """Checks that need no registry: ranges and formats of single fields. One line each."""
    return [
        *_training_problems(cfg),
        *_data_problems(cfg),
        *_run_problems(cfg),
        *_admm_problems(cfg),
        *_kfac_problems(cfg),
        *_ddp_sync_problems(cfg),
        *_graph_problems(cfg),
        *_naming_problems(cfg),
        *_choice_problems(cfg),
    ]


def _checker() -> tuple[list[str], Callable[[bool, str], None]]:
    """A problems list and ``need(ok, msg)``, which adds ``msg`` to it where ``ok`` is false."""
    problems: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    return problems, need


def _training_problems(cfg: RunConfig) -> list[str]:
    """Workers, epochs, batch size and the optimizer's numbers: each in its range."""
    problems, need = _checker()
    need(cfg.workers is None or cfg.workers >= 1, f"workers must be >= 1 (workers: {cfg.workers})")
    need(cfg.epochs is None or cfg.epochs >= 1, f"epochs must be >= 1 (epochs: {cfg.epochs})")
    need(cfg.batch_size >= 1, f"batch-size must be >= 1 (batch-size: {cfg.batch_size})")
    need(
        cfg.lr is None or (math.isfinite(cfg.lr) and cfg.lr > 0),
        f"lr must be a positive number (lr: {cfg.lr})",
    )
    need(0 <= cfg.momentum < 1, f"momentum must be in [0, 1) (momentum: {cfg.momentum})")
    need(cfg.weight_decay >= 0, f"weight-decay must be >= 0 (weight-decay: {cfg.weight_decay})")
    return problems


def _data_problems(cfg: RunConfig) -> list[str]:
    """The data options: splits, downsampling, patches and the synthetic data set's size."""
    problems, need = _checker()
    need(
        0 <= cfg.val_fraction < 1,
        f"val-fraction must be in [0, 1) (val-fraction: {cfg.val_fraction})",
    )
    need(cfg.downsample >= 1, f"downsample must be >= 1 (downsample: {cfg.downsample})")
    need(
        cfg.train_fraction is None or 0 < cfg.train_fraction < 1,
        f"train-fraction must be in (0, 1) (train-fraction: {cfg.train_fraction})",
    )
    need(
        cfg.patch == 0 or (cfg.patch > 0 and cfg.patch % 2 == 1),
        f"patch must be 0 or an odd window size (patch: {cfg.patch})",
    )
    need(cfg.synthetic_n >= 10, f"synthetic-n must be >= 10 (synthetic-n: {cfg.synthetic_n})")
    need(
        cfg.synthetic_features >= 1,
        f"synthetic-features must be >= 1 (synthetic-features: {cfg.synthetic_features})",
    )
    need(
        cfg.synthetic_classes >= 2,
        f"synthetic-classes must be >= 2 (synthetic-classes: {cfg.synthetic_classes})",
    )
    return problems


def _run_problems(cfg: RunConfig) -> list[str]:
    """The run's checkpoints, threads, restarts and evaluations, and the pipeline's micro-batches."""
    problems, need = _checker()
    need(
        cfg.checkpoint_every >= 0,
        f"checkpoint-every must be >= 0 (checkpoint-every: {cfg.checkpoint_every})",
    )
    need(cfg.threads >= 0, f"threads must be >= 0 (threads: {cfg.threads})")
    need(cfg.max_restarts >= 0, f"max-restarts must be >= 0 (max-restarts: {cfg.max_restarts})")
    need(cfg.eval_every >= 1, f"eval-every must be >= 1 (eval-every: {cfg.eval_every})")
    need(cfg.microbatches >= 1, f"microbatches must be >= 1 (microbatches: {cfg.microbatches})")
    return problems


def _admm_problems(cfg: RunConfig) -> list[str]:
    """pdADMM's options: penalties, the exchange's quantization, batches, solvers."""
    problems, need = _checker()
    need(cfg.rho > 0 and math.isfinite(cfg.rho), f"rho must be a positive number (rho: {cfg.rho})")
    need(cfg.nu > 0 and math.isfinite(cfg.nu), f"nu must be a positive number (nu: {cfg.nu})")
    need(cfg.quantize in (0, 8, 16), f"quantize must be 0, 8 or 16 (quantize: {cfg.quantize})")
    need(cfg.admm_batch >= 0, f"admm-batch must be >= 0 (admm-batch: {cfg.admm_batch})")
    need(cfg.admm_inner >= 0, f"admm-inner must be >= 0 (admm-inner: {cfg.admm_inner})")
    need(cfg.rho_growth >= 1, f"rho-growth must be >= 1 (rho-growth: {cfg.rho_growth})")
    need(
        cfg.admm_tau >= 0 and math.isfinite(cfg.admm_tau),
        f"admm-tau must be a number >= 0 (admm-tau: {cfg.admm_tau})",
    )
    need(
        cfg.admm_ridge is None or (cfg.admm_ridge >= 0 and math.isfinite(cfg.admm_ridge)),
        f"admm-ridge must be a number >= 0 (admm-ridge: {cfg.admm_ridge})",
    )
    need(
        cfg.admm_momentum is None or 0 <= cfg.admm_momentum < 1,
        f"admm-momentum must be in [0, 1) (admm-momentum: {cfg.admm_momentum})",
    )
    need(
        cfg.admm_memory is None or 0 <= cfg.admm_memory < 1,
        f"admm-memory must be in [0, 1) (admm-memory: {cfg.admm_memory})",
    )
    need(
        cfg.admm_sweeps is None or cfg.admm_sweeps >= 0,
        f"admm-sweeps must be >= 0 (admm-sweeps: {cfg.admm_sweeps})",
    )
    need(cfg.admm_cg_iters >= 1, f"admm-cg-iters must be >= 1 (admm-cg-iters: {cfg.admm_cg_iters})")
    return problems


def _kfac_problems(cfg: RunConfig) -> list[str]:
    """K-FAC's options (issue 12): update intervals, damping, clipping, factor decay."""
    problems, need = _checker()
    need(
        cfg.kfac_factor_every >= 1,
        f"kfac-factor-every must be >= 1 (kfac-factor-every: {cfg.kfac_factor_every})",
    )
    need(
        cfg.kfac_inv_every >= 1,
        f"kfac-inv-every must be >= 1 (kfac-inv-every: {cfg.kfac_inv_every})",
    )
    need(
        math.isfinite(cfg.kfac_damping) and cfg.kfac_damping > 0,
        f"kfac-damping must be a positive number (kfac-damping: {cfg.kfac_damping})",
    )
    need(
        math.isfinite(cfg.kfac_kl_clip) and cfg.kfac_kl_clip >= 0,
        f"kfac-kl-clip must be >= 0 (kfac-kl-clip: {cfg.kfac_kl_clip})",
    )
    need(
        0 <= cfg.kfac_factor_decay < 1,
        f"kfac-factor-decay must be in [0, 1) (kfac-factor-decay: {cfg.kfac_factor_decay})",
    )
    return problems


def _ddp_sync_problems(cfg: RunConfig) -> list[str]:
    """ddp's gradient sync: compression, local SGD, sync plans, and what combines with what."""
    problems, need = _checker()
    problems.extend(compress_problems(cfg.compress))
    start = cfg.compress_start
    need(start is None or start >= 0, f"compress-start must be >= 0 (compress-start: {start})")
    need(
        start is None
        or start >= 2
        or not (cfg.error_feedback or cfg.warm_start)
        or not cfg.compress.startswith(("powersgd", "auto")),
        "compress-start must be >= 2 for powersgd with error feedback or warm start: DDP "
        f"rebuilds its buckets after step 1 (compress-start: {start}, compress: {cfg.compress})",
    )
    need(cfg.local_sgd >= 0, f"local-sgd must be >= 0 (local-sgd: {cfg.local_sgd})")
    need(
        cfg.local_sgd_warmup is None or cfg.local_sgd_warmup >= 0,
        f"local-sgd-warmup must be >= 0 (local-sgd-warmup: {cfg.local_sgd_warmup})",
    )
    need(
        cfg.optimizer != Optimizer.KFAC or (cfg.compress == "none" and not cfg.local_sgd),
        "optimizer kfac runs with plain gradient all-reduce: drop --compress and --local-sgd "
        f"(compress: {cfg.compress}, local-sgd: {cfg.local_sgd})",
    )
    # a sync plan other than allreduce replaces DDP's buckets and comm hook, where the
    # compressors, local SGD and K-FAC's factor traffic live
    need(
        cfg.sync_plan == "allreduce"
        or (cfg.compress == "none" and not cfg.local_sgd and cfg.optimizer != Optimizer.KFAC),
        f"sync-plan {cfg.sync_plan} synchronises each tensor its own way and does not combine "
        "with --compress, --local-sgd or --optimizer kfac: drop them or use --sync-plan "
        f"allreduce (compress: {cfg.compress}, local-sgd: {cfg.local_sgd}, optimizer: "
        f"{cfg.optimizer})",
    )
    need(
        not (cfg.local_sgd and cfg.compress != "none"),
        f"local-sgd and compress cannot be combined (local-sgd: {cfg.local_sgd}, compress: {cfg.compress})",
    )
    return problems


def _graph_problems(cfg: RunConfig) -> list[str]:
    """The graph options (issue 10): hops, and the synthetic SBM graph's degree and homophily."""
    problems, need = _checker()
    need(cfg.graph_hops >= 0, f"graph-hops must be >= 0 (graph-hops: {cfg.graph_hops})")
    need(
        0 < cfg.sbm_degree < cfg.synthetic_n - 1,
        f"sbm-degree must be > 0 and below synthetic-n - 1 (sbm-degree: {cfg.sbm_degree}, "
        f"synthetic-n: {cfg.synthetic_n})",
    )
    need(
        0 <= cfg.sbm_homophily <= 1,
        f"sbm-homophily must be in [0, 1] (sbm-homophily: {cfg.sbm_homophily})",
    )
    return problems


def _naming_problems(cfg: RunConfig) -> list[str]:
    """The names a user gives: the chosen classes, and the run folder's name."""
    problems, need = _checker()
    if cfg.classes is not None:
        need(
            len(cfg.classes) >= 2, f"classes must name at least 2 classes (classes: {cfg.classes})"
        )
        need(
            len(set(cfg.classes)) == len(cfg.classes),
            f"classes must not repeat (classes: {cfg.classes})",
        )
    if cfg.name is not None:
        need(
            cfg.name not in ("", ".", "..") and "/" not in cfg.name and "\\" not in cfg.name,
            f"name must be a plain folder name (name: {cfg.name!r})",
        )
    return problems


def _choice_problems(cfg: RunConfig) -> list[str]:
    """Every field with a fixed list of choices holds one of them."""
    problems = []
    for f in fields(RunConfig):
        choices = f.metadata.get("choices")
        value = getattr(cfg, f.name)
        if choices and value not in choices:
            problems.append(
                f"{f.name.replace('_', '-')} must be one of {', '.join(choices)} (got {value!r})"
            )
    return problems


def kfac_worker_problems(fraction: float, workers: int) -> list[str]:
    """``--kfac-grad-workers F`` must be in [1/workers, 1] and F x workers a divisor of workers.

    F x workers ranks precondition each layer (KAISA's gradient workers; rounded to a whole
    number within 0.05, so that 0.33 means 1 of 3); the ranks form a grid with that many
    rows, so it must divide the worker count.
    """
    count = fraction * workers
    if not (math.isfinite(count) and 0.95 <= count <= workers + 0.05):
        return [
            f"kfac-grad-workers must be in [1/workers, 1] = [{1 / workers:.4g}, 1] "
            f"(kfac-grad-workers: {fraction}, workers: {workers})"
        ]
    if abs(count - round(count)) > 0.05 or workers % round(count):
        return [
            f"kfac-grad-workers times workers must be a whole divisor of workers "
            f"(kfac-grad-workers: {fraction}, workers: {workers}, product: {count:.4g})"
        ]
    return []
