"""A strategy's options: a frozen dataclass whose fields say each option's type, default and accepted range.

Every strategy declares its options as a subclass of :class:`StrategyOptions` (which holds ``seeding``, accepted by
all of them); :func:`option` gives a field its default and range. Building the dataclass checks every field, so a
strategy built in code and a ``[strategy]`` table of an experiment file are refused alike: one
:class:`OptionError` that names the option.

Example::

    @dataclass(frozen=True, kw_only=True)
    class GeneticOptions(StrategyOptions):
        population: int = option(20, low=2)
        cxpb: float = option(0.5, low=0.0, high=1.0)

    GeneticOptions.parse({"population": 1}, "ga")
    # OptionError: population: must be an integer >= 2, got 1
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal, Self, Union, get_args, get_origin, get_type_hints

Seeding = Literal["random", "hardware"]
SEEDINGS: tuple[str, ...] = get_args(Seeding)


class OptionError(ValueError):
    """A bad strategy option; ``name`` is the option's name."""

    def __init__(self, name: str, message: str):
        self.name = name
        super().__init__(f"{name}: {message}")


def option(default: Any, low: float | None = None, high: float | None = None) -> Any:
    """A field of a strategy's options: its default and the range ``[low, high]`` a number must lie in (either
    end None: open). The field's annotation gives its type; ``T | None`` accepts None, which leaves the choice to
    the strategy."""
    return field(default=default, metadata={"range": (low, high)})


_HINTS: dict[type, dict[str, Any]] = {}  # an options class -> its fields' types, resolved once


def _types(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _describe(kind: type, low: float | None, high: float | None, optional: bool) -> str:
    span = f" in [{low}, {high}]" if high is not None else (f" >= {low}" if low is not None else "")
    return f"must be {'an integer' if kind is int else kind.__name__}{span}{' or omitted' if optional else ''}"


def _checked(f: Field[Any], hint: Any, value: Any) -> Any:
    """``value`` as field ``f`` keeps it (an integer given for a number becomes a float); OptionError if it is
    of the wrong type or out of range."""
    args = get_args(hint)
    optional = get_origin(hint) in (Union, types.UnionType) and type(None) in args
    kind = next(a for a in args if a is not type(None)) if optional else hint
    if get_origin(kind) is Literal:
        if value not in get_args(kind):
            raise OptionError(f.name, f"must be one of {', '.join(get_args(kind))}, got {value!r}")
        return value
    if value is None and optional:
        return None
    low, high = f.metadata.get("range", (None, None))
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    else:
        raise TypeError(f"{f.name}: options are bool, int, float or a Literal, not {kind!r}")
    if ok and low is not None and value < low:
        ok = False
    if ok and high is not None and value > high:
        ok = False
    if not ok:
        raise OptionError(f.name, f"{_describe(kind, low, high, optional)}, got {value!r}")
    return float(value) if kind is float else value


@dataclass(frozen=True, kw_only=True)
class StrategyOptions:
    """The options every strategy accepts; a strategy with options of its own subclasses this."""

    #: how the first points are picked: ``random`` (spread over the space) or ``hardware`` (half of them ranked
    #: by the space's estimate, :mod:`evotune.search.seeding`)
    seeding: Seeding = "random"

    def __post_init__(self) -> None:
        hints = _types(type(self))
        for f in fields(self):
            object.__setattr__(self, f.name, _checked(f, hints[f.name], getattr(self, f.name)))

    @classmethod
    def names(cls) -> list[str]:
        return sorted(f.name for f in fields(cls))

    @classmethod
    def parse(cls, given: Mapping[str, Any], strategy: str) -> Self:
        """These options from ``given`` (an experiment file's table, or keyword arguments) for the strategy named
        ``strategy``; OptionError for an unknown name or a value of the wrong type or range."""
        accepted = {f.name for f in fields(cls)}
        for name in given:
            if name not in accepted:
                own = sorted(accepted - {"seeding"})
                raise OptionError(name, f"unknown option for strategy {strategy!r}; accepted: "
                                        f"{', '.join([*own, 'seeding'])}")
        return cls(**given)
