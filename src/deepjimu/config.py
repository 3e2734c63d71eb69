"""RunConfig: every option of a run, from flags or a TOML file, validated before any worker starts."""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from deepjimu.errors import JimuError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["PRECISIONS", "ConfigErrors", "RunConfig", "load_config", "option_fields"]

PRECISIONS = ("fp32", "tf32", "bf16")  # see deepjimu.precision


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None, **kw: Any) -> Any:
    meta = {"help": help, "choices": choices}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass
class RunConfig:
    """All options of one training run. Field names are the flags (``--batch-size``) and TOML keys.

    ``None`` means "the strategy's default" for ``workers``, ``epochs`` and ``lr``;
    :func:`deepjimu.strategies.resolve` fills them in.
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
    device: str = _opt("auto", "auto, cpu or cuda", choices=("auto", "cpu", "cuda"))
    quiet: bool = _opt(False, "no progress bar")
    threads: int = _opt(0, "CPU threads per worker (0: cores / workers on this machine)")
    precision: str = _opt(
        "fp32",
        "matmul precision: fp32, tf32 (CUDA tensor cores) or bf16 (autocast)",
        choices=PRECISIONS,
    )
    # data
    data_dir: str = _opt("data", "folder with dataset files")
    download: bool = _opt(False, "fetch missing dataset files (checksums verified)")
    data_url: str | None = _opt(None, "base URL of a mirror for --download")
    val_fraction: float = _opt(0.1, "fraction of the training set held out for validation")
    downsample: int = _opt(1, "average-pool images by this factor per side (2: 28x28 -> 14x14)")
    classes: list[int] | None = _opt(None, "keep only these classes, e.g. 0,1")
    normalize: bool = _opt(False, "standardise features with the training mean and std")
    synthetic_n: int = _opt(10000, "synthetic: number of samples (train + test)")
    synthetic_features: int = _opt(196, "synthetic: number of input features")
    synthetic_classes: int = _opt(10, "synthetic: number of classes")
    # optimisation (gradient strategies)
    epochs: int | None = _opt(None, "passes over the training data (admm: iterations)")
    batch_size: int = _opt(64, "global mini-batch size (split over data-parallel workers)")
    optimizer: str = _opt("adam", "optimizer of gradient strategies", choices=("adam", "sgd"))
    lr: float | None = _opt(None, "learning rate (default: 1e-3 adam, 0.05 sgd)")
    momentum: float = _opt(0.9, "SGD momentum")
    weight_decay: float = _opt(0.0, "L2 weight decay")
    # checkpoints and logging
    checkpoint_every: int = _opt(0, "save a checkpoint every K epochs (0: only at the end)")
    resume: str | None = _opt(None, "run folder to resume from")
    eval_every: int = _opt(1, "evaluate and log every K epochs")
    # pipeline
    schedule: str = _opt("gpipe", "pipeline schedule", choices=("gpipe", "1f1b", "interleaved"))
    microbatches: int = _opt(4, "pipeline micro-batches per mini-batch")
    balance: str = _opt("time", "stage split: time, size or N,N,...")
    # admm
    rho: float = _opt(1.0, "admm: penalty of the p = q coupling")
    nu: float = _opt(1.0, "admm: weight of the layer equations")
    quantize: int = _opt(0, "admm: bits of exchanged activations (0 off, 8 or 16)")
    admm_batch: int = _opt(0, "admm: mini-batch size (0: full batch)")
    admm_inner: int = _opt(0, "admm: iterations per mini-batch (0: twice the number of layers)")
    rho_growth: float = _opt(1.0, "admm: multiply rho by this when the residual stalls")

    def to_dict(self) -> dict[str, Any]:
        """Plain values, suitable for JSON and TOML."""
        return dataclasses.asdict(self)

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
    """The fields of :class:`RunConfig`, in declaration order (they become the CLI flags)."""
    return list(fields(RunConfig))


def _field_kind(f: dataclasses.Field[Any]) -> str:
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
    f = {f.name: f for f in fields(RunConfig)}[name]
    kind = _field_kind(f)
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
        want = {"list[int]": "a list of integers"}.get(kind, f"a {kind}")
        raise JimuError(
            f"{source}: {name.replace('_', '-')} must be {want} (got {value!r})"
        ) from None


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
    known = {f.name for f in fields(RunConfig)}
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
    problems = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    need(cfg.workers is None or cfg.workers >= 1, f"workers must be >= 1 (workers: {cfg.workers})")
    need(cfg.epochs is None or cfg.epochs >= 1, f"epochs must be >= 1 (epochs: {cfg.epochs})")
    need(cfg.batch_size >= 1, f"batch-size must be >= 1 (batch-size: {cfg.batch_size})")
    need(
        cfg.lr is None or (math.isfinite(cfg.lr) and cfg.lr > 0),
        f"lr must be a positive number (lr: {cfg.lr})",
    )
    need(0 <= cfg.momentum < 1, f"momentum must be in [0, 1) (momentum: {cfg.momentum})")
    need(cfg.weight_decay >= 0, f"weight-decay must be >= 0 (weight-decay: {cfg.weight_decay})")
    need(
        0 <= cfg.val_fraction < 1,
        f"val-fraction must be in [0, 1) (val-fraction: {cfg.val_fraction})",
    )
    need(cfg.downsample >= 1, f"downsample must be >= 1 (downsample: {cfg.downsample})")
    need(cfg.synthetic_n >= 10, f"synthetic-n must be >= 10 (synthetic-n: {cfg.synthetic_n})")
    need(
        cfg.synthetic_features >= 1,
        f"synthetic-features must be >= 1 (synthetic-features: {cfg.synthetic_features})",
    )
    need(
        cfg.synthetic_classes >= 2,
        f"synthetic-classes must be >= 2 (synthetic-classes: {cfg.synthetic_classes})",
    )
    need(
        cfg.checkpoint_every >= 0,
        f"checkpoint-every must be >= 0 (checkpoint-every: {cfg.checkpoint_every})",
    )
    need(cfg.threads >= 0, f"threads must be >= 0 (threads: {cfg.threads})")
    need(cfg.eval_every >= 1, f"eval-every must be >= 1 (eval-every: {cfg.eval_every})")
    need(cfg.microbatches >= 1, f"microbatches must be >= 1 (microbatches: {cfg.microbatches})")
    need(cfg.rho > 0 and math.isfinite(cfg.rho), f"rho must be a positive number (rho: {cfg.rho})")
    need(cfg.nu > 0 and math.isfinite(cfg.nu), f"nu must be a positive number (nu: {cfg.nu})")
    need(cfg.quantize in (0, 8, 16), f"quantize must be 0, 8 or 16 (quantize: {cfg.quantize})")
    need(cfg.admm_batch >= 0, f"admm-batch must be >= 0 (admm-batch: {cfg.admm_batch})")
    need(cfg.admm_inner >= 0, f"admm-inner must be >= 0 (admm-inner: {cfg.admm_inner})")
    need(cfg.rho_growth >= 1, f"rho-growth must be >= 1 (rho-growth: {cfg.rho_growth})")
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
    for f in fields(RunConfig):
        choices = f.metadata.get("choices")
        value = getattr(cfg, f.name)
        if choices and value not in choices:
            problems.append(
                f"{f.name.replace('_', '-')} must be one of {', '.join(choices)} (got {value!r})"
            )
    return problems


def validate(cfg: RunConfig) -> RunConfig:
    """Check every field and fill the strategy's defaults; the result is what workers run.

    Returns:
        a new RunConfig with ``workers``, ``epochs`` and ``lr`` set.

    Raises:
        ConfigErrors: one line per bad field (unknown strategy or dataset, workers < 1,
            more workers than blocks for a strategy that splits the model, ...).
    """
    from deepjimu.data import dataset_names
    from deepjimu.models import count_blocks
    from deepjimu.strategies import get_strategy

    problems = basic_problems(cfg)
    if cfg.dataset not in dataset_names():
        problems.append(f"unknown dataset {cfg.dataset!r} (known: {', '.join(dataset_names())})")
    n_blocks = 0
    try:
        n_blocks = count_blocks(cfg.model)
    except JimuError as e:
        problems.append(str(e))
    try:
        strategy = get_strategy(cfg.strategy)
    except JimuError as e:
        problems.append(str(e))
        raise ConfigErrors(problems) from None
    workers = cfg.workers if cfg.workers is not None else strategy.default_workers
    if strategy.max_workers is not None and workers > strategy.max_workers:
        problems.append(
            f"strategy {cfg.strategy} runs on at most {strategy.max_workers} worker(s) (workers: {workers})"
        )
    if strategy.splits_model and n_blocks and workers > n_blocks:
        problems.append(
            f"strategy {cfg.strategy} needs at least one block per worker "
            f"(workers: {workers}, blocks in {cfg.model}: {n_blocks})"
        )
    if cfg.precision not in strategy.precisions and cfg.precision in PRECISIONS:
        problems.append(
            f"strategy {cfg.strategy} does not support --precision {cfg.precision} "
            f"(supported: {', '.join(strategy.precisions)})"
        )
    if cfg.precision == "tf32" and cfg.device == "cpu":
        problems.append("precision tf32 needs --device cuda or auto (TF32 is a GPU mode)")
    if not problems:
        problems.extend(strategy.problems(cfg, n_blocks))
    if problems:
        raise ConfigErrors(problems)
    lr = cfg.lr if cfg.lr is not None else (1e-3 if cfg.optimizer == "adam" else 0.05)
    epochs = cfg.epochs if cfg.epochs is not None else strategy.default_epochs
    return dataclasses.replace(cfg, workers=workers, epochs=epochs, lr=lr)
