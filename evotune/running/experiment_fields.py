"""Reading an experiment file's fields, each mistake one :class:`ExperimentError` that names the file and the field.

:class:`FieldReader` holds the checks every part of an experiment file shares (a table, known keys only, a
non-empty string, a positive integer or number); :mod:`evotune.running.experiment` reads the file's sections with
them.

Example::

    fields = FieldReader(Path("experiments/x.toml"))
    fields.positive_int({"trials": 0}, "trials", "budget.trials")
    # ExperimentError: experiments/x.toml: budget.trials: must be a positive integer, got 0
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, overload


class ExperimentError(ValueError):
    """A bad experiment file. ``str()`` is the one-line message shown to the user."""

    def __init__(self, path: str | Path, fieldname: str, message: str):
        self.path, self.field, self.message = str(path), fieldname, message
        super().__init__(f"{path}: {fieldname}: {message}")


class FieldReader:
    """The field checks of one experiment file at ``path``: each raises :class:`ExperimentError` naming it."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, fieldname: str, message: str) -> ExperimentError:
        return ExperimentError(self.path, fieldname, message)

    def table(self, data: dict[str, Any], key: str, allowed: set[str], where: str) -> dict[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(f"{where}{key}", f"must be a table, got {type(value).__name__}")
        self.no_unknown(value, allowed, f"{where}{key}.")
        return value

    def no_unknown(self, data: dict[str, Any], allowed: set[str], prefix: str) -> None:
        for k in data:
            if k not in allowed:
                raise self.fail(f"{prefix}{k}", f"unknown field; accepted: {', '.join(sorted(allowed))}")

    def tables(self, value: Any, key: str, fields: str) -> list[tuple[str, dict[str, Any]]]:
        """``[key]`` (one table) or ``[[key]]`` (several), each with the name errors should use for it."""
        items = value if isinstance(value, list) else [value]
        out = []
        for i, item in enumerate(items):
            where = f"{key}[{i}]" if isinstance(value, list) else key
            if not isinstance(item, dict):
                raise self.fail(where, f"must be a table with {fields}")
            out.append((where, item))
        return out

    def string(self, data: dict[str, Any], key: str, fieldname: str, default: str | None = None) -> str:
        value = data.get(key, default)
        if value is None:
            raise self.fail(fieldname, "missing (required)")
        if not isinstance(value, str) or not value:
            raise self.fail(fieldname, f"must be a non-empty string, got {value!r}")
        return value

    @overload
    def positive_int(self, data: dict[str, Any], key: str, fieldname: str, default: int,
                     minimum: int = 1) -> int: ...

    @overload
    def positive_int(self, data: dict[str, Any], key: str, fieldname: str, default: None = None,
                     minimum: int = 1) -> int | None: ...

    def positive_int(self, data: dict[str, Any], key: str, fieldname: str, default: int | None = None,
                     minimum: int = 1) -> int | None:
        """``data[key]``, an integer >= ``minimum``, else ``default``: an int whenever the default is one
        (TOML has no null)."""
        value = data.get(key, default)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.fail(fieldname, f"must be {what}, got {value!r}")
        return value

    def positive_number(self, data: dict[str, Any], key: str, fieldname: str) -> float | None:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise self.fail(fieldname, f"must be a positive number, got {value!r}")
        return value
