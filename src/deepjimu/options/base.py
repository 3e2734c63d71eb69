"""The option group: a frozen dataclass of options that checks its own values, and the helpers its groups are declared with.

No torch import here: ``--help`` is built before torch loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from deepjimu.applies import EVERYWHERE, Applies
from deepjimu.choices import Choice

__all__ = ["Group", "checker", "choice_problems", "minimums", "narrow", "option"]


def option(
    default: Any,
    help: str,
    choices: tuple[str, ...] | None = None,
    commas: bool = False,
    applies: Applies = EVERYWHERE,
    default_text: str | None = None,
    **kw: Any,
) -> Any:
    """One option of a group: its default, ``--help`` text and where it applies.

    ``choices``: the values of a plain str option (a :class:`~deepjimu.choices.Choice`
    default brings its enum's instead); ``commas``: a value may itself contain commas (not
    a list of values); ``applies``: where the option applies (a run elsewhere refuses it
    when given, :mod:`deepjimu.applies`); ``default_text``: the default as ``--help``
    names it, where the value (None) is filled in when the run starts.
    """
    kind = type(default) if isinstance(default, Choice) else None
    meta = {
        "help": help,
        "choices": kind.spellings() if kind else choices,
        "enum": kind,
        "commas": commas,
        "applies": applies,
        "default_text": default_text,
    }
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def checker() -> tuple[list[str], Callable[[bool, str], None]]:
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
    section; ``universal``: its options apply to every run (else only to the strategies
    that take the group, :attr:`deepjimu.strategies.registry.Entry.options`).
    An option with a closed set of values holds its :mod:`~deepjimu.choices` member; a
    spelling outside the set stays a string, for :meth:`problems` to name.
    """

    table: ClassVar[str] = ""
    title: ClassVar[str] = ""
    universal: ClassVar[bool] = False

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


def minimums(cfg: Any, lows: dict[str, float]) -> list[str]:
    """``name must be >= low`` for every option of ``lows`` below its minimum (None: unset, fine)."""
    out = []
    for name, low in lows.items():
        value = getattr(cfg, name)
        if value is not None and not value >= low:  # NaN too
            flag = name.replace("_", "-")
            out.append(f"{flag} must be >= {low:g} ({flag}: {value})")
    return out


def choice_problems(cfg: Any, group: type[Group]) -> list[str]:
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


G = TypeVar("G", bound=Group)


def narrow(cfg: Any, kind: type[G]) -> G:
    """``kind`` (a group, or a strategy's composition of groups) with ``cfg``'s values of its options.

    Example:
        >>> narrow(AdmmGroup(rho=2.0), AdmmGroup).rho
        2.0
    """
    return kind(**{f.name: getattr(cfg, f.name) for f in fields(kind)})
