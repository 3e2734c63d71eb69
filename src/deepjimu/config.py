"""RunConfig: every option of a run, from flags or a TOML file, validated before any worker starts."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

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
    group_of,
)
from deepjimu.options.groups import between_groups

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "CONFIG_VERSION",
    "ConfigErrors",
    "RunConfig",
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
            *between_groups(self),
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
