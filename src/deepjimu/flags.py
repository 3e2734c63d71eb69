"""Every option of a run as a command-line flag: one ``--help`` section per option group, each flag's help saying where it applies and its defaults.

Above the strategy registry (which names the strategies an option applies to, and their
rows of the family defaults) and light: no torch import, since ``--help`` is built before
torch loads (the thread plan must come first).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from typing import Any

from deepjimu import defaults
from deepjimu.applies import Applies
from deepjimu.config import RunConfig, field_kind
from deepjimu.options import GROUPS
from deepjimu.strategies.registry import (
    Traits,
    applies,
    entry_traits,
    family_rows,
    strategy_names,
)

__all__ = ["add_options"]


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
    by_family = defaults.help_text(f.name, family_rows())  # the family table's, where it sets one
    text = f"default: {_default_text(f, default)}" + (f"; {by_family}" if by_family else "")
    help_text += f" ({_where(applies(f.name))}{text})"
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


def _default_text(f: dataclasses.Field[Any], default: Any) -> str:
    """An option's own default as ``--help`` names it: a None that the run fills in names
    what fills it (the option's ``default_text``, else each strategy's ``Traits.default_<name>``,
    e.g. ``2; strategy local: 1``)."""
    if default is not None:
        return str(default)
    if f.metadata.get("default_text"):
        return str(f.metadata["default_text"])
    trait = f"default_{f.name}"
    if not hasattr(Traits, trait):  # None is the value itself (none, or auto)
        return "None"
    own = {n: getattr(entry_traits(n), trait) for n in strategy_names()}
    common = Counter(own.values()).most_common(1)[0][0]
    others = ", ".join(f"{n}: {v}" for n, v in own.items() if v != common)
    return f"{common}; strategy {others}" if others else str(common)


def _where(applies: Applies) -> str:
    """The start of a flag's help parenthesis: ``for strategy admm; `` (nothing: everywhere)."""
    if applies.everywhere:
        return ""
    text = applies.text()
    for value, stricter in applies.values:
        text += f"{'; ' if text else ''}{value}: {stricter.text()}"
    return f"for {text}; "
