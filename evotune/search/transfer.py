"""Sources for transfer: related results of the same space, gathered for a target problem and GPU.

A source (:class:`~evotune.search.prior.Source`) is matched by space and
parameters: it must describe configurations of the same parameters (another
shape of the same kernel, or the same kernel on another GPU). Its ``distance``
to the target says how related it is (:func:`problem_distance` plus
:func:`device_distance`); ``default`` weights and orders its sources by it.

Where sources come from:

* :func:`from_landscape`: a recorded landscape (every point it holds);
* :func:`from_studies`: the finished studies of an experiment's storage of the same
  space for other problems (all trials of one problem's studies make one source);
* :func:`from_cache`: the tuning-result cache's best configuration per problem
  (a winner to try first, with no ranking to lend);
* :func:`shipped_landscapes`: the landscapes shipped with evotune (``evotune/landscapes/``, package
  data, so the same ones wherever evotune is installed or run from) of a space: an experiment's
  sources unless it says otherwise.

Example::

    sources = [from_landscape(load_landscape(p), target.problem, "NVIDIA H100 80GB HBM3") for p in others]
    make_strategy("default", space, fs, seed=0, ctx=ctx, sources=sources)
"""

from __future__ import annotations

import functools
import math
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from evotune.core.hardware import canonical_name
from evotune.core.landscape import SHIPPED, Landscape, LandscapeError, landscape_header, load_landscape
from evotune.core.problem import Problem
from evotune.core.result import Status
from evotune.core.space import Point, SearchSpace
from evotune.search.prior import Source
from evotune.storage.summaries import StudySummary, finished_trials, study_summaries

#: a study counts as a source once it holds this many measured results
MIN_RESULTS = 10
#: distance added for each non-numeric field that differs (dtype, layout, kind)
MISMATCH = 3.0
VENDORS = ("nvidia", "amd", "intel", "apple")


def shipped_landscapes(space: SearchSpace, folder: Path = SHIPPED) -> list[Path]:
    """The shipped landscape files of ``space``: those that name it and its parameters and load, in name order
    (the generic ``landscape`` space of a replay holds every kernel's files: only the same kernel's match)."""
    names = tuple(p.name for p in space.params)
    return [p for p, s, n in _shipped_index(folder) if s == space.name and n == names and _loads(p)]


@functools.lru_cache(maxsize=4)
def _shipped_index(folder: Path) -> tuple[tuple[Path, str, tuple[str, ...]], ...]:
    """(file, its space, its parameters) for every landscape under ``folder``, as its header says; other files
    are left out. Only the headers: loading every shipped landscape took seconds at the start of every run with
    a strategy that transfers, though a run's space matches a few of them or none."""
    out = []
    for p in sorted(folder.glob("*/*.json.gz")) if folder.is_dir() else []:
        try:
            space, names = landscape_header(p)
        except (LandscapeError, OSError):
            continue
        out.append((p, space, names))
    return tuple(out)


def read_landscape(path: Path) -> Landscape:
    """A landscape named as a source, read once per version of the file (its path, size and time): every
    (problem, strategy, seed) of a run asks for the same ones, and :func:`shipped_landscapes` has read them
    already. LandscapeError or OSError as :func:`load_landscape` raises them."""
    stat = path.stat()
    return _read(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=128)
def _read(path: Path, mtime_ns: int, size: int) -> Landscape:
    return load_landscape(path)


def _loads(path: Path) -> bool:
    """Whether a shipped file whose header matches loads: one that does not is left out, as one without a header."""
    try:
        read_landscape(path)
    except (LandscapeError, OSError):
        return False
    return True


def _sizes(problem: Problem) -> dict[str, Any]:
    """A problem's comparable fields: its JSON form with a recorded kernel's label split into sizes."""
    d = {k: v for k, v in problem.to_dict().items() if k != "extra"}
    d.update(dict(problem.extra))
    label = str(d.pop("label", "") or "")
    for i, part in enumerate(re.findall(r"\d+", label)):
        d[f"size{i}"] = int(part)
    return d


def problem_distance(a: Problem, b: Problem) -> float:
    """How different two problems are: |log2| of the ratio of each size, plus MISMATCH per other field
    that differs (a GEMM twice as tall is 1 away; int8 against bf16 is 3 away)."""
    da, db = _sizes(a), _sizes(b)
    total = 0.0
    for key in sorted(set(da) | set(db)):
        x, y = da.get(key), db.get(key)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (x, y))
        if numeric:
            total += abs(math.log2(float(x) / float(y)))  # type: ignore[arg-type]
        elif x != y:
            total += MISMATCH
    return total


def vendor(device: str) -> str:
    """The GPU's vendor as named in its device string ("" when it does not say)."""
    low = device.lower()
    for v in VENDORS:
        if v in low:
            return v
    if re.search(r"\b(radeon|instinct|mi\d+)", low):
        return "amd"
    if re.search(r"\b(geforce|rtx|tesla|quadro|[ahb]\d{3})", low):
        return "nvidia"
    return ""


def device_distance(a: str | None, b: str | None) -> float:
    """0 for the same GPU, however it is spelt (:func:`~evotune.core.hardware.canonical_name`: an experiment's
    "H100" is the "NVIDIA H100 80GB HBM3" a landscape recorded), or when either is not known; 1 for another of
    the same vendor (or of a vendor the device string does not name), 2 for another vendor's."""
    a, b = (a or "").strip(), (b or "").strip()
    if not a or not b or canonical_name(a) == canonical_name(b):
        return 0.0
    va, vb = vendor(a), vendor(b)
    return 2.0 if va and vb and va != vb else 1.0


def from_landscape(ls: Landscape, problem: Problem, device: str | None, name: str | None = None) -> Source:
    """Every point of a recorded landscape, for a target ``problem`` on ``device``."""
    results = tuple((dict(zip(ls.names, key, strict=True)), r.time_ms if r.status is Status.OK else None)
                    for key, r in ls.entries.items())
    dist = problem_distance(ls.problem, problem) + device_distance(ls.meta.get("device"), device)
    return Source(name or f"landscape:{ls.stem}", results, dist)


class SettledTrials:
    """The finished trials of studies that will not change any more, read once: for a caller that tunes problem
    after problem in one storage and knows which studies are done (``settled``), so that each later problem's
    sources do not read every earlier study again (half a second a key after a few dozen keys)."""

    def __init__(self, settled: Callable[[StudySummary], bool]):
        self.settled = settled
        self._trials: dict[str, tuple[optuna.trial.FrozenTrial, ...]] = {}

    def of(self, storage: optuna.storages.BaseStorage, summary: StudySummary) -> tuple[optuna.trial.FrozenTrial, ...]:
        """``summary``'s complete and failed trials, kept where its study is settled."""
        got = self._trials.get(summary.study_name)
        if got is None:
            got = finished_trials(storage, summary.study_name)
            if self.settled(summary):
                self._trials[summary.study_name] = got
        return got


def from_studies(storage: optuna.storages.BaseStorage, space: SearchSpace, problem: Problem,
                 device: str | None, experiment: str | None = None,
                 settled: SettledTrials | None = None) -> list[Source]:
    """One source per other problem of ``space`` in ``storage`` (of ``experiment``, when given), from the
    trials of its studies that hold at least MIN_RESULTS measured results (the settled studies' read once through
    ``settled``)."""
    by_problem: dict[str, list[StudySummary]] = defaultdict(list)
    for s in study_summaries(storage):
        a = s.user_attrs
        if a.get("space") != space.name or (experiment is not None and a.get("experiment") != experiment):
            continue
        if a.get("problem_key") == problem.key:
            continue
        by_problem[str(a.get("problem_key"))].append(s)
    out = []
    for key, summaries in sorted(by_problem.items()):
        results: dict[str, tuple[Point, float | None]] = {}
        for s in summaries:
            trials = settled.of(storage, s) if settled is not None else finished_trials(storage, s.study_name)
            for t in trials:
                try:
                    point = space.from_storage(t.params)
                except (KeyError, ValueError):
                    continue
                value = t.value if t.state == optuna.trial.TrialState.COMPLETE else None
                old = results.get(space.key(point))
                if old is None or (value is not None and (old[1] is None or value < old[1])):
                    results[space.key(point)] = (point, value)
        if sum(v is not None for _, v in results.values()) < MIN_RESULTS:
            continue
        a = summaries[0].user_attrs
        other = Problem.from_dict(a["problem"])
        dist = problem_distance(other, problem) + device_distance(a.get("device") or a.get("hardware"), device)
        out.append(Source(f"study:{a.get('experiment')}/{key}", tuple(results.values()), dist))
    return out


def from_cache(entries: list[dict[str, Any]], space: SearchSpace, problem: Problem,
               device: str | None) -> list[Source]:
    """The tuning-result cache's winners of ``space`` for other problems (read by ``lookup.read_tuned``)."""
    out = []
    for e in entries:
        if e.get("space") != space.name or e.get("problem_key") == problem.key:
            continue
        try:
            point = space.from_storage(e["config"])
        except (KeyError, ValueError):
            continue
        other = Problem.from_dict(e["problem"])
        dist = problem_distance(other, problem) + device_distance(e.get("hardware"), device)
        out.append(Source(f"cache:{e['problem_key']}", ((point, float(e["time_ms"])),), dist))
    return out
