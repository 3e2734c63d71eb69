"""A bench's options: what it runs (:class:`BenchOptions`), read from ``jimu bench``'s flags, and the command that repeats it."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepjimu.bench.flags import MATRIX_DEFAULTS, option_argv, train_flags
from deepjimu.bench.matrix import parse_list, parse_workers
from deepjimu.errors import JimuError
from deepjimu.record.read import check_targets

__all__ = ["DEFAULTS", "BenchOptions", "bench_command", "bench_options", "option_text"]

# the bench's own flags; None in the namespace means "not given" (so --resume can tell)
DEFAULTS: dict[str, Any] = {
    "bench_dir": "bench",
    **MATRIX_DEFAULTS,
    "dataset": "digits",
    "data_dir": "data",
    "seed": 0,
    "timeout": 300.0,
    "train_args": "",
    "tune": False,
    "tune_trials": 5,
}
"""Every bench flag's value where it is not given (``--resume``: the recorded bench's)."""


@dataclass
class BenchOptions:
    """What one bench runs. ``epochs`` None: each strategy's default epochs; ``target_acc``
    and ``target_loss`` None: chosen from the runs (:func:`deepjimu.bench.results.choose_target`;
    a validation loss on text data, else a test accuracy)."""

    name: str
    bench_dir: Path = Path("bench")
    strategies: tuple[str, ...] = tuple(MATRIX_DEFAULTS["strategies"].split(","))
    workers: tuple[int, ...] = (1, 2, 3)
    models: tuple[str, ...] = ("mlp:256x3",)
    dataset: str = "digits"
    data_dir: str = "data"
    epochs: int | None = None
    target_acc: float | None = None
    target_loss: float | None = None
    seed: int = 0
    timeout: float = 300.0
    train_args: str = ""
    flags: dict[str, str] = field(default_factory=dict)
    tune: int = 0

    @property
    def out_dir(self) -> Path:
        """``<bench_dir>/<name>``."""
        return self.bench_dir / self.name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (for :data:`RECORD`)."""
        return {**dataclasses.asdict(self), "bench_dir": str(self.bench_dir)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchOptions:
        """The options :meth:`to_dict` wrote."""
        return cls(
            **{
                **d,
                "bench_dir": Path(d["bench_dir"]),
                "strategies": tuple(d["strategies"]),
                "workers": tuple(d["workers"]),
                "models": tuple(d["models"]),
            }
        )


def bench_options(args: argparse.Namespace, base: BenchOptions | None = None) -> BenchOptions:
    """The bench that ``args`` describe; options not given come from ``base`` (a resumed
    bench's record), else the defaults.

    Raises:
        JimuError: a bad value.
    """
    keys = (*DEFAULTS, "name", "epochs", "target_acc", "target_loss")
    given = {k: v for k in keys if (v := getattr(args, k, None)) is not None}
    if given.get("epochs", 1) < 1:
        raise JimuError(f"--epochs must be >= 1 (epochs: {given['epochs']})")
    check_targets(given.get("target_acc"), given.get("target_loss"))
    if "target_acc" in given and "target_loss" in given:
        raise JimuError("give one target: --target-acc or --target-loss, not both")
    if given.get("timeout", 1) <= 0:
        raise JimuError(f"--timeout must be > 0 seconds (timeout: {given['timeout']})")
    if given.get("tune_trials", 1) < 1:
        raise JimuError(f"--tune-trials must be >= 1 (tune-trials: {given['tune_trials']})")
    if base is None:
        values = {**DEFAULTS, **given}
        opts = BenchOptions(
            name=given.get("name") or f"bench-{datetime.datetime.now():%Y%m%d-%H%M%S}"
        )
        tune, trials = values["tune"], values["tune_trials"]
    else:
        values = given
        opts = dataclasses.replace(base, flags=dict(base.flags))
        tune = given.get("tune", bool(base.tune))
        trials = given.get("tune_trials", base.tune or DEFAULTS["tune_trials"])
    for k, v in values.items():
        if k in ("strategies", "models"):
            setattr(opts, k, tuple(parse_list(v, k)))
        elif k == "workers":
            opts.workers = tuple(parse_workers(v))
        elif k == "bench_dir":
            opts.bench_dir = Path(v)
        elif k not in ("tune", "tune_trials"):
            setattr(opts, k, v)
    opts.tune = trials if tune else 0
    if "target_loss" in given:  # a target given on resume replaces the recorded one
        opts.target_acc = None
    elif "target_acc" in given:
        opts.target_loss = None
    opts.flags.update(train_flags(args))
    return opts


def bench_command(opts: BenchOptions) -> str:
    """The ``jimu bench`` command line that repeats ``opts`` (for the report)."""
    argv = ["--name", opts.name, "--bench-dir", str(opts.bench_dir)]
    argv += [
        "--strategies",
        ",".join(opts.strategies),
        "--workers",
        ",".join(map(str, opts.workers)),
    ]
    argv += [
        "--models",
        ",".join(opts.models),
        "--dataset",
        opts.dataset,
        "--data-dir",
        opts.data_dir,
    ]
    argv += ["--seed", str(opts.seed), "--timeout", f"{opts.timeout:g}"]
    if opts.target_acc is not None:
        argv += ["--target-acc", f"{opts.target_acc:g}"]
    if opts.target_loss is not None:
        argv += ["--target-loss", f"{opts.target_loss:g}"]
    if opts.epochs is not None:
        argv += ["--epochs", str(opts.epochs)]
    if opts.tune:
        argv += ["--tune", "--tune-trials", str(opts.tune)]
    for k, v in opts.flags.items():
        argv += (
            option_argv(((k, v),)) if v in ("true", "false") else [f"--{k.replace('_', '-')}", v]
        )
    if opts.train_args:
        argv += ["--train-args", opts.train_args]
    return "jimu bench " + shlex.join(argv)


def option_text(value: Any) -> str:
    """A bench option's value as its flag reads (a tuple as a comma list, None as ``default``)."""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return "default" if value is None else str(value)
