"""RunConfig: every option of a run, from flags or a TOML file, validated before any worker starts."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from deepjimu import defaults
from deepjimu.applies import Applies
from deepjimu.choices import Optimizer
from deepjimu.errors import JimuError
from deepjimu.options import (
    GROUPS,
    AdmmGroup,
    DataGroup,
    KfacGroup,
    OptimGroup,
    PipelineGroup,
    RunGroup,
    SyncGroup,
    applies_of,
    group_of,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "CONFIG_VERSION",
    "DEFAULT_LR",
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


@dataclass(frozen=True)
class RunConfig(SyncGroup, KfacGroup, AdmmGroup, PipelineGroup, OptimGroup, DataGroup, RunGroup):
    """All options of one training run: every option group (:mod:`deepjimu.options`) together.

    Field names are the flags (``--batch-size``) and TOML keys. ``None`` means "the
    strategy's default" for ``workers``, ``epochs`` and ``lr``;
    :func:`deepjimu.validation.validate` fills them in. ``given``, not an option, names
    those the user gave (:func:`given_options`). A strategy is handed only its own groups
    (:func:`deepjimu.options.narrow`).
    """

    # not an option: which options the user gave (given_options), and where
    given: dict[str, str] | None = field(default=None, compare=False, metadata={"option": False})

    def problems(self) -> list[str]:
        """Every group's checks of its own values, then those between groups. One line each."""
        return [
            *(p for group in GROUPS for p in group.problems(self)),
            *_between_groups(self),
        ]

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
    parser: argparse.ArgumentParser, exclude: frozenset[str] = frozenset(), note: str = ""
) -> None:
    """Add a flag for every option not in ``exclude`` (``--batch-size``, ...), one ``--help``
    section per option group (:data:`deepjimu.options.GROUPS`), ``note`` under the first.

    Flags that are not given stay out of the namespace (``argparse.SUPPRESS``), so
    :func:`flag_values` returns only what the user said.
    """
    own = RunConfig().to_dict()
    for i, group in enumerate(GROUPS):
        section = parser.add_argument_group(f"{group.title} options", note if i == 0 else None)
        for f in group.options():
            if f.name not in exclude:
                _add_flag(section, f, own[f.name])


def _add_flag(section: argparse._ArgumentGroup, f: dataclasses.Field[Any], default: Any) -> None:
    """One option's flag, its help ending in where it applies and its default."""
    flag = "--" + f.name.replace("_", "-")
    help_text = f.metadata.get("help", "")
    if f.metadata.get("choices"):
        help_text += f" ({'|'.join(f.metadata['choices'])})"
    by_family = defaults.help_text(f.name)  # the family table's, where it sets one
    text = f"default: {default}" + (f"; {by_family}" if by_family else "")
    help_text += f" ({_where(applies_of(f.name))}{text})"
    if field_kind(f) == "bool":
        section.add_argument(
            flag,
            dest=f.name,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=help_text,
        )
    else:
        section.add_argument(
            flag, dest=f.name, default=argparse.SUPPRESS, metavar=f.name.upper(), help=help_text
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

    A key outside any table may be any option; a table is an option group's
    (:data:`deepjimu.options.GROUPS`: ``[run]``, ``[data]``, ``[admm]``, ...) and holds
    only that group's options.

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
    flat, problems = _flatten_tables(raw, p)
    known = {f.name for f in option_fields()}
    out: dict[str, Any] = {}
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


def _flatten_tables(raw: dict[str, Any], path: Path) -> tuple[dict[str, Any], list[str]]:
    """A TOML file's options with their tables taken away, and a line for each key in a
    table that is no option group or not of that table's group."""
    tables = {g.table: g for g in GROUPS}
    flat: dict[str, Any] = {}
    problems = []
    for key, value in raw.items():
        if not isinstance(value, dict):
            flat[key] = value
        elif key not in tables:
            problems.append(
                f"{path}: unknown table [{key}] (the option groups: "
                f"{', '.join(f'[{t}]' for t in tables)})"
            )
        else:
            for option, v in value.items():
                name = option.replace("-", "_")
                try:
                    owner = group_of(name)
                except KeyError:
                    owner = tables[key]  # an unknown option: read_toml names it
                if owner is not tables[key]:
                    problems.append(
                        f"{path}: [{key}] has no option {option!r} (it belongs in [{owner.table}])"
                    )
                flat[option] = v
    return flat, problems


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


def _between_groups(cfg: RunConfig) -> list[str]:
    """What the optimiser group allows of the ddp sync group: K-FAC and sync plans replace the
    gradient all-reduce where the compressors and local SGD live."""
    problems = []
    if cfg.optimizer == Optimizer.KFAC and (cfg.compress != "none" or cfg.local_sgd):
        problems.append(
            "optimizer kfac runs with plain gradient all-reduce: drop --compress and --local-sgd "
            f"(compress: {cfg.compress}, local-sgd: {cfg.local_sgd})"
        )
    # a sync plan other than allreduce replaces DDP's buckets and comm hook, where the
    # compressors, local SGD and K-FAC's factor traffic live
    if cfg.sync_plan != "allreduce" and (
        cfg.compress != "none" or cfg.local_sgd or cfg.optimizer == Optimizer.KFAC
    ):
        problems.append(
            f"sync-plan {cfg.sync_plan} synchronises each tensor its own way and does not combine "
            "with --compress, --local-sgd or --optimizer kfac: drop them or use --sync-plan "
            f"allreduce (compress: {cfg.compress}, local-sgd: {cfg.local_sgd}, optimizer: "
            f"{cfg.optimizer})"
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
