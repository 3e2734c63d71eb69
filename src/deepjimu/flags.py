"""Every option of a run as a command-line flag: one ``--help`` section per option group, each flag's help saying where it applies and its defaults.

Above the strategy registry (which names the strategies an option applies to, and their
rows of the family defaults) and light: no torch import, since ``--help`` is built before
torch loads (the thread plan must come first).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from deepjimu import defaults
from deepjimu.applies import Applies
from deepjimu.config import RunConfig, field_kind
from deepjimu.options import GROUPS
from deepjimu.strategies.registry import applies, family_rows

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
    text = f"default: {default}" + (f"; {by_family}" if by_family else "")
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


def _where(applies: Applies) -> str:
    """The start of a flag's help parenthesis: ``for strategy admm; `` (nothing: everywhere)."""
    if applies.everywhere:
        return ""
    text = applies.text()
    for value, stricter in applies.values:
        text += f"{'; ' if text else ''}{value}: {stricter.text()}"
    return f"for {text}; "
