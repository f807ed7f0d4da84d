"""Recorded landscapes: every measured point of a space for one problem on one GPU.

Two formats are read, plain or gzipped JSON, told apart by their content:

* **Kernel Tuner cache files** (``tune_params``, ``tune_params_keys``, ``cache``),
  times in milliseconds (read by :mod:`evotune.core.kernel_tuner_cache`).
* **evotune landscapes** (``"format": "evotune-landscape"``), documented in
  ``docs/LANDSCAPE_FORMAT.md``: the parameters once, then one row per point (written by :func:`write_landscape`;
  :mod:`evotune.core.landscape_convert` rewrites any readable landscape in it).

Example::

    from evotune.core.landscape import SHIPPED, load_landscape
    ls = load_landscape(SHIPPED / "kerneltuner" / "pnpoly_RTX_2080_Ti.json.gz")
    len(ls), ls.optimum_ms, ls.problem.key
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evotune.core.flush import UNRECORDED_FLUSH
from evotune.core.kernel_tuner_cache import (
    KernelTunerCacheError,
    is_kernel_tuner,
    kernel_tuner_names,
    read_kernel_tuner,
)
from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Context, FeasibleSet, Param, Point, SearchSpace, categorical, constraint, ordinal

#: the recorded landscapes shipped with evotune, as package data (``evotune/landscapes/``): a wheel carries them,
#: so an installed evotune finds the same ones from any folder
SHIPPED = Path(__file__).resolve().parents[1] / "landscapes"
FORMAT = "evotune-landscape"
VERSION = 1
COLUMNS = ["params", "status", "time_ms", "compile_s", "bench_s", "error", "samples_ms", "message"]

class LandscapeError(ValueError):
    """A landscape file that cannot be read; the message names the file."""


def landscape_stem(path: str | Path) -> str:
    """A landscape file's name without ``.gz`` and ``.json``: names its rows, plots and space."""
    name = Path(path).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


@dataclass
class Landscape:
    """Parameters (ordered choices), one EvalResult per recorded point, and metadata."""

    params: list[Param]
    entries: dict[tuple[Any, ...], EvalResult]
    problem: Problem
    meta: dict[str, Any] = field(default_factory=dict)
    space_name: str = "landscape"
    path: str = ""

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def stem(self) -> str:
        """The file name without .json / .json.gz: names the space and the plots."""
        return landscape_stem(self.path)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def key(self, point: Point) -> tuple[Any, ...]:
        return tuple(p.choices[p.index(point[p.name])] for p in self.params)

    def lookup(self, point: Point) -> EvalResult | None:
        try:
            return self.entries.get(self.key(point))
        except (KeyError, ValueError):
            return None

    @property
    def ok_times(self) -> list[float]:
        # an OK result always has a time (EvalResult refuses one without); the second test narrows the type
        return [r.time_ms for r in self.entries.values() if r.status is Status.OK and r.time_ms is not None]

    @property
    def optimum_ms(self) -> float | None:
        times = self.ok_times
        return min(times) if times else None

    @property
    def flush(self) -> tuple[str, bool] | None:
        """(the L2 flush its times were measured after, whether the file names it): a GPU recording that names
        none was measured after the only flush there was then (:data:`UNRECORDED_FLUSH`); None for a Kernel
        Tuner file, which evotune's oracle did not measure."""
        if self.meta.get("source") == "kernel_tuner":
            return None
        flush = self.meta.get("flush")
        return (flush, True) if isinstance(flush, str) else (UNRECORDED_FLUSH, False)

    @property
    def baselines(self) -> dict[str, Any]:
        return dict(self.meta.get("baselines") or {})

    def _is_recorded(self) -> Any:
        recorded, names = set(self.entries), self.names

        def is_recorded(p: Point, ctx: Context) -> bool:
            return tuple(p[n] for n in names) in recorded

        return is_recorded

    def replayed(self, space: SearchSpace) -> SearchSpace:
        """``space`` as a replay of this file sees it: no kernel counts as built on this machine (the replay must
        not depend on a local kernel cache), and for a file that holds part of the space (a sampled recording)
        only the recorded points are feasible, so that a search is never handed a point the file cannot answer."""
        space = replace(space, built=None)
        if self.meta.get("complete", True):
            return space
        space = replace(space, _feasible={}, constraints=[*space.constraints, constraint(
            "recorded", self._is_recorded(), "not in the recorded landscape (a sampled recording)")])
        space.preset_feasible(FeasibleSet.from_codes(
            space, (space.encode(dict(zip(self.names, k, strict=True))) for k in self.entries)))
        return space

    def space(self) -> SearchSpace:
        """A space over the recorded parameters where only recorded points are feasible."""
        recorded = set(self.entries)
        names = self.names
        is_recorded = self._is_recorded()

        space = SearchSpace(
            name=self.space_name if self.space_name != "landscape" else f"landscape:{self.stem}",
            params=list(self.params),
            constraints=[constraint("recorded", is_recorded, "not in the recorded landscape")],
            description=f"recorded on {self.meta.get('device', '?')}: {self.problem.describe()}",
            default_problem=self.problem,
            workload=self.problem.kind,
        )
        # Feasibility here depends on nothing but the file, so enumerate the
        # recorded points directly instead of the (much larger) full product.
        fs = FeasibleSet.from_codes(space, (space.encode(dict(zip(names, k, strict=True))) for k in recorded))
        space.preset_feasible(fs)
        return space


# -- reading ----------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise LandscapeError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        raise LandscapeError(f"{path}: not JSON or gzipped JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise LandscapeError(f"{path}: expected a JSON object at the top level")
    return data


def load_landscape(path: str | Path) -> Landscape:
    """Read a Kernel Tuner cache file or an evotune landscape (plain or ``.gz``)."""
    path = Path(path)
    data = _read_json(path)
    ls = _from_evotune(data, path) if _is_evotune(data, path) else _from_kernel_tuner(data, path)
    if not ls.entries:
        raise LandscapeError(f"{path}: holds no recorded points")
    ls.path = str(path)
    return ls


def landscape_header(path: str | Path) -> tuple[str, tuple[str, ...]]:
    """(the space, the parameters' names) a landscape file says it holds, read without its points: building a
    landscape's entries is most of the cost of reading one. LandscapeError for a file that is not one; a file
    can pass here and still fail :func:`load_landscape` on its points."""
    path = Path(path)
    data = _read_json(path)
    evotune = _is_evotune(data, path)
    try:
        if evotune:
            return str(data.get("space", "landscape")), tuple(str(spec["name"]) for spec in data["params"])
        return "landscape", tuple(kernel_tuner_names(data))
    except (KeyError, TypeError) as exc:
        raise LandscapeError(f"{path}: malformed landscape ({type(exc).__name__}: {exc})") from exc


def _is_evotune(data: dict[str, Any], path: Path) -> bool:
    """Whether ``data`` is an evotune landscape (else a Kernel Tuner cache file); LandscapeError for neither."""
    if data.get("format") == FORMAT:
        return True
    if is_kernel_tuner(data):
        return False
    raise LandscapeError(f"{path}: neither a Kernel Tuner cache file nor an evotune landscape")


def _from_kernel_tuner(data: dict[str, Any], path: Path) -> Landscape:
    try:
        cache = read_kernel_tuner(data)
    except KernelTunerCacheError as exc:
        raise LandscapeError(f"{path}: {exc}") from exc
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise LandscapeError(f"{path}: malformed Kernel Tuner cache file ({type(exc).__name__}: {exc})") from exc
    return Landscape(cache.params, cache.entries, cache.problem, cache.meta)


def _from_evotune(data: dict[str, Any], path: Path) -> Landscape:
    try:
        if data.get("version") != VERSION:
            raise LandscapeError(f"{path}: version: {data.get('version')!r}, this evotune reads {VERSION}")
        params = [(ordinal if spec.get("ordered", True) else categorical)(spec["name"], spec["choices"])
                  for spec in data["params"]]
        cols = data.get("columns", COLUMNS)
        idx = {c: cols.index(c) for c in COLUMNS if c in cols}
        entries = {}
        for row in data["points"]:
            values = tuple(p.choices[p.index(v)] for p, v in zip(params, row[idx["params"]], strict=True))
            status = Status(row[idx["status"]])

            def col(name: str, default: Any = None, row: list[Any] = row) -> Any:
                return row[idx[name]] if name in idx and row[idx[name]] is not None else default

            entries[values] = EvalResult(
                status, time_ms=col("time_ms"), samples_ms=list(col("samples_ms", [])),
                compile_s=float(col("compile_s", 0.0)), bench_s=float(col("bench_s", 0.0)),
                error=col("error"), message=col("message", ""))
        problem = Problem.from_dict(data["problem"])
    except LandscapeError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise LandscapeError(f"{path}: malformed evotune landscape ({type(exc).__name__}: {exc})") from exc
    meta = {k: v for k, v in data.items() if k not in ("params", "points", "columns", "problem", "format")}
    return Landscape(params, entries, problem, meta, space_name=data.get("space", "landscape"))


# -- writing ----------------------------------------------------------------
def landscape_document(
    space_params: Iterable[Param],
    rows: Iterable[tuple[Point, EvalResult]],
    problem: Problem,
    meta: Mapping[str, Any],
    space_name: str,
    max_samples: int | None = 16,
    exact: bool = False,
) -> dict[str, Any]:
    """The JSON document of an evotune landscape; ``max_samples`` bounds the samples kept per point.

    Times, costs and errors are rounded (to 6, 4 and 6 significant digits) unless
    ``exact``: a measurement's noise is far above that, but a converted landscape
    must replay exactly like its source, tuning clock included, so ``convert``
    keeps every float as it is. Samples are always rounded: replay never reads them.
    """
    params = list(space_params)
    names = [p.name for p in params]
    keep = (lambda x, digits=6: x) if exact else _round
    points = []
    for point, r in rows:
        samples = _spread(list(r.samples_ms), max_samples)
        points.append([
            json_values(point, names),
            r.status.value, keep(r.time_ms), keep(r.compile_s, 4), keep(r.bench_s, 4),
            keep(r.error), [_round(s) for s in samples], r.message,
        ])
    doc = {
        "format": FORMAT, "version": VERSION, "space": space_name, "problem": problem.to_dict(),
        "params": [{"name": p.name, "choices": [list(c) if isinstance(c, tuple) else c for c in p.choices],
                    "ordered": p.ordered} for p in params],
        "columns": COLUMNS, "points": points,
    }
    doc.update({k: v for k, v in meta.items() if k not in doc})
    doc.setdefault("date", _dt.date.today().isoformat())
    return doc


def json_values(point: Point, names: Iterable[str]) -> list[Any]:
    """A point's values in ``names`` order as a landscape row holds them (tuples as JSON arrays)."""
    return [list(v) if isinstance(v, tuple) else v for v in (point[n] for n in names)]


def _spread(samples: list[float], n: int | None) -> list[float]:
    """At most ``n`` of the samples, evenly spread over their sorted range, so the distribution survives."""
    if n is None or len(samples) <= n:
        return samples
    if n <= 0:
        return []
    ordered = sorted(samples)
    if n == 1:
        return [ordered[len(ordered) // 2]]
    step = (len(ordered) - 1) / (n - 1)
    return [ordered[round(i * step)] for i in range(n)]


def _round(x: float | None, digits: int = 6) -> float | None:
    if x is None:
        return None
    return float(f"{x:.{digits}g}")


def write_landscape(path: str | Path, document: dict[str, Any]) -> Path:
    """Write a landscape document; ``.gz`` paths are gzipped. Written atomically."""
    path = Path(path)
    return write_atomically(path, encoded(document, gz=path.suffix == ".gz"))


def encoded(document: dict[str, Any], gz: bool) -> bytes:
    """A landscape document as a file holds it: compact JSON, gzipped for a ``.gz`` file."""
    text = json.dumps(document, separators=(",", ":")).encode()
    return gzip.compress(text, 9, mtime=0) if gz else text  # mtime 0: the same document, the same bytes


def write_atomically(path: Path, raw: bytes) -> Path:
    """Write ``raw`` to ``path`` whole or not at all (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per writer: workers may write the same file
    tmp.write_bytes(raw)
    tmp.replace(path)  # atomic: a reader never sees half a file, and a source converted in place survives
    return path
