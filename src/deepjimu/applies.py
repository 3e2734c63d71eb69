"""Applies: where an option of a run applies (strategies, data, a condition), declared next to its help.

Every :class:`~deepjimu.config.RunConfig` field carries one :class:`Applies` in its metadata.
The same declaration writes the "for ..." part of the option's ``--help`` and refuses, in
one line, an option that the user gave for a run where it does not apply
(:func:`deepjimu.validation.validate`); the per-family defaults are applied only where
they apply. No torch import here: ``--help`` is built before torch loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from deepjimu.choices import Family

__all__ = ["EVERYWHERE", "Applies", "Condition", "Takers"]


@dataclass(frozen=True)
class Condition:
    """A condition on the run's other options, e.g. ``--optimizer kfac``.

    ``text`` reads after "with" (``--optimizer kfac``); ``holds`` tests a
    :class:`~deepjimu.config.RunConfig`; ``shows`` names the options it reads, whose values
    a refusal shows (``this run has optimizer adam``).
    """

    text: str
    holds: Callable[[Any], bool]
    shows: tuple[str, ...]


@dataclass(frozen=True)
class Takers:
    """The strategies an option applies to, said by what they declare: those that take the
    option ``group`` (:mod:`deepjimu.options`), or those whose traits hold ``trait``
    (:class:`~deepjimu.strategies.registry.Traits`). Named only through the strategy
    registry (:func:`deepjimu.validation.resolved`), so that no option names a strategy."""

    group: type | None = None
    trait: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class Applies:
    """Where an option applies; a part left empty applies everywhere.

    Args:
        strategies: the strategies (registry names) that read the option, or
            :class:`Takers` that say which (resolved to names before :meth:`text` or
            :meth:`refusal` is asked).
        data: data families (:class:`~deepjimu.choices.Family`) and data set names.
        when: a further condition on the other options.
        values: a stricter declaration for some of the option's values, e.g.
            ``(("kfac", Applies(strategies=Takers(group=KfacGroup))),)`` for ``--optimizer``.

    Example:
        >>> Applies(strategies=("ddp",), when=Condition("--local-sgd > 0", bool, ())).text()
        'strategy ddp with --local-sgd > 0'
    """

    strategies: tuple[str, ...] | Takers = ()
    data: tuple[str, ...] = ()
    when: Condition | None = None
    values: tuple[tuple[str, Applies], ...] = ()

    @property
    def everywhere(self) -> bool:
        """True when the option applies to every run."""
        return not (self.strategies or self.data or self.when or self.values)

    def resolved(self, names: Callable[[Takers], tuple[str, ...]]) -> Applies:
        """This declaration with its :class:`Takers` (and its values') named by ``names``."""
        strategies = self.strategies
        return dataclasses.replace(
            self,
            strategies=names(strategies) if isinstance(strategies, Takers) else strategies,
            values=tuple((v, a.resolved(names)) for v, a in self.values),
        )

    def _names(self) -> tuple[str, ...]:
        assert not isinstance(self.strategies, Takers), "resolve the strategies first"
        return self.strategies

    def text(self, expand: Callable[[Family], Sequence[str]] | None = None) -> str:
        """Where the option applies, in words (``values`` aside).

        Args:
            expand: the data sets of a family (from the registry); without it families are
                named only (``graph data``), as ``--help`` does before torch loads.
        """
        parts = []
        if self.strategies:
            names = self._names()
            s = "strategy" if len(names) == 1 else "strategies"
            parts.append(f"{s} {', '.join(names)}")
        if self.data:
            parts.append(self._data_text(expand))
        text = " on ".join(parts)
        if self.when is not None:
            text = f"{text} with {self.when.text}" if text else f"runs with {self.when.text}"
        return text

    def _data_text(self, expand: Callable[[Family], Sequence[str]] | None) -> str:
        families = [Family(d) for d in self.data if d in Family.spellings()]
        names = [d for d in self.data if d not in Family.spellings()]
        if expand is not None and families and names:  # mixed: every data set by name
            return f"data sets {', '.join([n for f in families for n in expand(f)] + names)}"
        if not families:
            return f"data set{'s' if len(names) > 1 else ''} {', '.join(names)}"
        text = _and([f.noun for f in families]) + " data"
        if expand is not None:
            return f"{text} sets ({', '.join(n for f in families for n in expand(f))})"
        return f"{text} and {', '.join(names)}" if names else text

    def refusal(self, cfg: Any, family: Family | None) -> str | None:
        """Why the option does not apply to ``cfg`` (``strategy local is not one``), or None.

        Args:
            cfg: the run's options.
            family: the family of ``cfg.dataset`` (None: an unknown data set, not judged).
        """
        if self.strategies and cfg.strategy not in self._names():
            return f"strategy {cfg.strategy} is not one"
        if self.data and family is not None and not {family, cfg.dataset} & set(self.data):
            return f"dataset {cfg.dataset} is not one"
        if self.when is not None and not self.when.holds(cfg):
            shown = (f"{n.replace('_', '-')} {getattr(cfg, n)}" for n in self.when.shows)
            return "this run has " + ", ".join(shown)
        return None

    def of_value(self, value: Any) -> Applies | None:
        """The stricter declaration of ``value``, if it has one."""
        return dict(self.values).get(str(value))


EVERYWHERE = Applies()


def _and(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
