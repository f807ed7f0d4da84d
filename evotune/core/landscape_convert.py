"""Converting a landscape (any format :func:`~evotune.core.landscape.load_landscape` reads: a Kernel Tuner cache,
evotune's own) to evotune's format, with the digits a :class:`Rounding` keeps of its times and costs.

Example::

    convert_files(["cache.json"], "evotune/landscapes/kerneltuner", rounding=Rounding(time_digits=4))
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evotune.core.landscape import (
    Landscape,
    LandscapeError,
    encoded,
    landscape_document,
    landscape_stem,
    load_landscape,
    write_atomically,
    write_landscape,
)
from evotune.core.result import EvalResult
from evotune.core.space import Point

#: the most significant digits a double needs: a float written with 17 reads back as itself
EXACT_DIGITS = 17


@dataclass(frozen=True)
class Rounding:
    """The significant digits a converted landscape keeps of ``time_ms`` and of ``compile_s`` and ``bench_s``;
    None (the default) keeps every float exactly.

    Times keep at least ``time_digits``: more where that many would make two different times of the file
    equal, so that any two points' times compare as they did (a model fitted to them may still propose
    otherwise where its choice hinges on round-off). Rounded costs move only the tuning clock, by a fraction
    of a measurement's noise: a seconds budget may stop a run one trial sooner or later.
    """

    time_digits: int | None = None
    cost_digits: int | None = None

    def __post_init__(self) -> None:
        for name in ("time_digits", "cost_digits"):
            digits = getattr(self, name)
            if digits is not None and not 1 <= digits <= EXACT_DIGITS:
                raise ValueError(f"{name}: expected 1 to {EXACT_DIGITS} significant digits, got {digits!r}")

    def rows(self, ls: Landscape) -> list[tuple[Point, EvalResult]]:
        """``ls``'s points in its order, each with its result rounded."""
        names = ls.names
        times = {r.time_ms for r in ls.entries.values() if r.time_ms is not None}
        time_digits = None if self.time_digits is None else _distinct_digits(times, self.time_digits)
        return [(dict(zip(names, key, strict=True)),
                 replace(r, time_ms=None if r.time_ms is None else _significant(r.time_ms, time_digits),
                         compile_s=_significant(r.compile_s, self.cost_digits),
                         bench_s=_significant(r.bench_s, self.cost_digits)))
                for key, r in ls.entries.items()]


def _distinct_digits(values: set[float], at_least: int) -> int | None:
    """The fewest significant digits, ``at_least`` or more, that keep every two of ``values`` apart (None: all)."""
    for digits in range(at_least, EXACT_DIGITS):
        if len({_significant(v, digits) for v in values}) == len(values):
            return digits
    return None


def _significant(x: float, digits: int | None) -> float:
    return x if digits is None else float(f"{x:.{digits}g}")


#: every float of a converted landscape kept as it is
EXACT = Rounding()


def convert(src: str | Path, dst: str | Path, max_samples: int | None = 0, rounding: Rounding = EXACT) -> Path:
    """Rewrite any readable landscape (e.g. a Kernel Tuner cache) in evotune's format.

    By default the result replays exactly like the source: the same points, statuses, messages,
    times and recorded costs (not rounded); only the timing samples are cut to
    ``max_samples`` per point. ``rounding`` keeps fewer digits of times and costs (a smaller file).
    """
    return write_landscape(dst, converted_document(src, max_samples, rounding))


def converted_document(src: str | Path, max_samples: int | None = 0,
                       rounding: Rounding = EXACT) -> dict[str, Any]:
    """The evotune document :func:`convert` writes for ``src``; raises LandscapeError naming the file."""
    ls = load_landscape(src)
    meta = {k: v for k, v in ls.meta.items() if k not in ("version", "space")}
    meta.setdefault("converted_from", Path(src).name)
    return landscape_document(ls.params, rounding.rows(ls), ls.problem, meta, ls.space_name, max_samples, exact=True)


def convert_files(sources: Iterable[str | Path], out: str | Path, max_samples: int | None = 0,
                  rounding: Rounding = EXACT) -> list[Path]:
    """Convert every source to ``out/<stem>.json.gz``; every source is read and checked before anything is written.

    The stem (the file name without ``.json``/``.gz``) is kept, so a converted
    landscape keeps its name in ``compare``'s rows and plots.
    """
    out = Path(out)
    docs: dict[Path, bytes] = {}
    for src in sources:
        dst = out / f"{landscape_stem(src)}.json.gz"
        if dst in docs:
            raise LandscapeError(f"{src}: a second source named {landscape_stem(src)!r}; rename one")
        # compressed in memory: a dozen documents of a few hundred kB, nothing on disk until all are read
        docs[dst] = encoded(converted_document(src, max_samples, rounding), gz=True)
    for dst, raw in docs.items():
        write_atomically(dst, raw)
    return list(docs)
