"""Parameters, points, contexts and named constraints: what a search space is declared with.

A parameter has a name and an ordered tuple of choices; a point maps each name to one choice. A
:class:`Context` (the GPU and the problem) is what feasibility depends on besides the point, and a
:class:`Constraint` is a named rule over both, with the message shown when it prunes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evotune.core.hardware import Hardware
    from evotune.core.problem import Problem

#: one parameter's value: one of its choices (a tuple for a shape such as a cluster; stored as "2x1"; None where a
#: launch option's choice is "the compiler's default", as Triton's ``maxnreg``)
ParamValue = bool | int | float | str | tuple[int, ...] | None
#: a point: each parameter's name -> its value
Point = dict[str, ParamValue]
#: a point as a space's own functions read it (constraints, estimates, the configurations it names): each value
#: has the type of its parameter's choices, which the space declares and a type checker cannot see through the
#: parameter's name, so the values are left to the function that reads them. A Point is accepted as one.
SpacePoint = dict[str, Any]
#: a choice as Optuna storage keeps it (a tuple choice as its text, ``"2x1"``)
Stored = bool | int | float | str | None

@dataclass(frozen=True)
class Param:
    """One knob: a name and its choices.

    ``ordered`` choices have a neighbourhood (4 is between 2 and 8), which
    mutation, repair and the samplers use; unordered ones are plain categories.
    """

    name: str
    choices: tuple[Any, ...]
    ordered: bool = True
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"parameter {self.name!r} has no choices")
        if len(set(map(_hashable, self.choices))) != len(self.choices):
            raise ValueError(f"parameter {self.name!r} repeats a choice")
        if len(set(self.storage_choices())) != len(self.choices):
            raise ValueError(f"parameter {self.name!r} has two choices that store alike: {self.choices}")
        bad = [c for c in self.storage_choices() if isinstance(c, str) and ("," in c or "=" in c)]
        if bad or "," in self.name or "=" in self.name:
            # a point's key is "name=value,..." and identifies it in storage: keep it unambiguous
            raise ValueError(f"parameter {self.name!r}: names and text choices may not hold ',' or '=': {bad}")

    @cached_property
    def _positions(self) -> dict[Any, int]:
        """Each choice's position, by value (a choice unequal to itself, a NaN, is left to the scan)."""
        return {_hashable(c): i for i, c in reversed(list(enumerate(self.choices))) if c == c}

    def index(self, value: Any) -> int:
        """Position of ``value`` among the choices (tuples and lists compare equal)."""
        # by hash first: encoding points is on every path that reads a landscape or looks a point up, thousands
        # of times a run; the scan answers the rest (a list for a tuple choice, a value that is not a choice)
        try:
            return self._positions[value]
        except (KeyError, TypeError):
            pass
        key = _hashable(value)
        for i, c in enumerate(self.choices):
            if _hashable(c) == key:
                return i
        raise ValueError(f"{value!r} is not a choice of {self.name!r}: {list(self.choices)}")

    def storage_value(self, value: Any) -> Stored:
        """A primitive for Optuna storage: tuples become ``"2x1"``."""
        if isinstance(value, (tuple, list)):
            return "x".join(str(v) for v in value)
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise ValueError(f"parameter {self.name!r}: {value!r} ({type(value).__name__}) cannot be stored; a choice is "
                         "a bool, int, float, str, None or a tuple of them")

    def storage_choices(self) -> tuple[Stored, ...]:
        return tuple(self.storage_value(c) for c in self.choices)

    def from_storage(self, value: Any) -> Any:
        return self.choices[self.storage_choices().index(value)]


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def categorical(name: str, choices: Iterable[Any], doc: str = "") -> Param:
    """Unordered choices (raster order, a layout, an algorithm)."""
    return Param(name, tuple(_hashable(c) for c in choices), ordered=False, doc=doc)


def ordinal(name: str, choices: Iterable[Any], doc: str = "") -> Param:
    """Ordered choices, kept in the order given (tile sizes, stage counts)."""
    return Param(name, tuple(_hashable(c) for c in choices), ordered=True, doc=doc)


def int_range(name: str, low: int, high: int, step: int = 1, doc: str = "") -> Param:
    """Integers ``low, low + step, ..., high`` (inclusive)."""
    return ordinal(name, range(low, high + 1, step), doc=doc)


def power_of_two(name: str, low: int, high: int, doc: str = "") -> Param:
    """Powers of two from ``low`` to ``high`` inclusive, e.g. 16, 32, ..., 256."""
    if low < 1 or high < low or low & (low - 1) or high & (high - 1):
        raise ValueError(f"{name}: bounds must be powers of two, low <= high")
    return ordinal(name, [1 << e for e in range(low.bit_length() - 1, high.bit_length())], doc=doc)


def boolean(name: str, doc: str = "") -> Param:
    return ordinal(name, (False, True), doc=doc)


def tuples(name: str, choices: Iterable[Sequence[Any]], doc: str = "") -> Param:
    """Tuple-valued choices, such as cluster shapes ``(1, 2)``; ordered by product."""
    items = sorted((tuple(c) for c in choices), key=lambda t: (math.prod(t), t))
    return Param(name, tuple(items), ordered=True, doc=doc)


@dataclass(frozen=True)
class Context:
    """What feasibility depends on besides the point itself."""

    hardware: Hardware | None = None
    problem: Problem | None = None
    # what the compiler said about the space's points on this hardware (an evotune.core.compile_results.CompiledTable):
    # estimates then take registers, shared memory and stages from the binaries; feasibility ignores it
    compiled: Any = field(default=None, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str]:
        return (
            self.hardware.name if self.hardware else "-",
            self.problem.key if self.problem else "-",
        )


Predicate = Callable[[SpacePoint, Context], bool]


@dataclass(frozen=True)
class Constraint:
    """A named rule. ``message`` is formatted with the point's values when it prunes.

    ``hardware`` marks limits of the chip (shared memory, cluster size, arch
    features) as opposed to rules of the kernel family itself.
    """

    name: str
    predicate: Predicate
    message: str
    hardware: bool = False

    def reason(self, point: Point, ctx: Context) -> str | None:
        if self.predicate(point, ctx):
            return None
        try:
            text = self.message.format(**point, ctx=ctx)
        except (KeyError, IndexError, AttributeError):
            text = self.message
        return f"{self.name}: {text}"


def deferred(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported on first call: keeps GPU-only imports (triton, cutlass) out of CPU runs."""
    import importlib

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


def constraint(name: str, predicate: Predicate, message: str) -> Constraint:
    """A rule of the kernel family (divisibility, a knob that needs another)."""
    return Constraint(name, predicate, message, hardware=False)


def hardware_limit(name: str, predicate: Predicate, message: str) -> Constraint:
    """A limit of the chip, checked before anything is compiled."""
    return Constraint(name, predicate, message, hardware=True)
