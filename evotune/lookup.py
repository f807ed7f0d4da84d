"""The tuning-result cache and the runtime API: ``lookup(problem)`` and ``compile_best(problem)``.

Every ``evotune run`` (and ``evotune best``) merges the best configuration of
each problem into one plain JSON file, so a program can ask for the best known
kernel without opening any study. The file (``$EVOTUNE_TUNED``, default
``~/.cache/evotune/tuned.json``) is a list of objects::

    {"space": "cute_hopper_gemm", "hardware": "NVIDIA H200", "problem_key": "gemm_bf16_tn_4096x4096x4096",
     "problem": {...}, "config": {"tile_m": 128, "cluster": "2x1", ...}, "time_ms": 0.178,
     "experiment": "h100_bf16_gemm", "study": "...", "storage": "sqlite:///...", "updated": "2026-11-21"}

A problem that was never tuned falls back to the tuned problem in the nearest
bucket (the workload's: for a GEMM, powers of two with the same dtype and
layout), and the answer says so.

Example::

    import evotune
    hit = evotune.lookup(Problem.gemm(4000, 4096, 4096, "bf16"))
    hit.exact, hit.note, hit.config
    gemm = evotune.compile_best(Problem.gemm(4096, 4096, 4096, "bf16"))
    gemm(a, b, c)
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evotune.problem import Problem


def tuned_path() -> Path:
    return Path(os.environ.get("EVOTUNE_TUNED", Path.home() / ".cache" / "evotune" / "tuned.json"))


@dataclass
class Tuned:
    space: str
    problem: Problem
    config: dict[str, Any]  # storage form: tuples as "2x1"
    time_ms: float
    hardware: str | None
    exact: bool  # False when the answer comes from another problem's bucket
    note: str
    source: dict[str, Any]


def read_tuned(path: Path | None = None) -> list[dict[str, Any]]:
    path = path or tuned_path()
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not a JSON tuning-result cache ({exc})") from exc
    return data if isinstance(data, list) else []


def remember(rows: Iterable[Any], storage: str, path: Path | None = None) -> Path:
    """Merge ``report.Best`` rows into the cache: one entry per (space, hardware, problem), the fastest kept."""
    path = path or tuned_path()
    entries = {(e["space"], e.get("hardware"), e["problem_key"]): e for e in read_tuned(path)}
    today = _dt.date.today().isoformat()
    for b in rows:
        key = (b.space, b.hardware, b.problem_key)
        old = entries.get(key)
        if old is not None and old["time_ms"] <= b.time_ms and old.get("study") != b.study:
            continue
        entries[key] = {"space": b.space, "hardware": b.hardware, "problem_key": b.problem_key,
                        "problem": b.problem, "config": b.config, "time_ms": b.time_ms, "experiment": b.experiment,
                        "study": b.study, "storage": storage, "updated": today}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(entries.values(), key=lambda e: (e["space"], e["problem_key"])), indent=1))
    tmp.replace(path)
    return path


def lookup(problem: Problem, space: str | None = None, hardware: str | None = None,
           path: Path | None = None) -> Tuned:
    """The best known configuration for ``problem``; raises LookupError when nothing comparable was tuned."""
    candidates = []
    for e in read_tuned(path):
        if (space and e["space"] != space) or (hardware and e.get("hardware") != hardware):
            continue
        p = Problem.from_dict(e["problem"])
        if _family(p) != _family(problem):
            continue
        candidates.append((p, e))
    exact = [(p, e) for p, e in candidates if p.key == problem.key]
    if exact:
        p, e = min(exact, key=lambda pe: pe[1]["time_ms"])
        return _tuned(e, p, True, f"tuned for {problem.describe()}")
    workload = problem.workload
    if not candidates or workload is None:  # a recorded kernel has no buckets
        raise LookupError(f"no tuned configuration for {problem.describe()}"
                          + (f" in space {space}" if space else "") + f" (cache: {path or tuned_path()})")
    target = problem.bucket()
    p, e = min(candidates, key=lambda pe: (workload.bucket_distance(pe[0].bucket(), target), pe[1]["time_ms"]))
    note = (f"{problem.describe()} was never tuned; using the best configuration of {p.describe()}, "
            f"the nearest power-of-two bucket ({target.describe()})")
    warnings.warn(note, stacklevel=2)
    return _tuned(e, p, False, note)


def _family(p: Problem) -> tuple[Any, ...]:
    """What must agree for one problem's configuration to serve another: the workload says (GEMM: kind,
    dtype, layout); a recorded kernel the same three."""
    w = p.workload
    return w.family(p) if w is not None else (p.kind, p.dtype, p.layout)


def _tuned(e: dict[str, Any], p: Problem, exact: bool, note: str) -> Tuned:
    return Tuned(e["space"], p, dict(e["config"]), float(e["time_ms"]), e.get("hardware"), exact, note, e)


def compile_best(problem: Problem, space: str | None = None, hardware: str | None = None,
                 path: Path | None = None) -> Any:
    """A ready kernel ``fn(a, b, c)`` for ``problem`` built from its best known configuration."""
    from evotune.plugins import load_space

    tuned = lookup(problem, space, hardware, path)
    sp = load_space(tuned.space)
    if sp.build is None:
        raise ValueError(f"space {tuned.space!r} has no build function")
    return sp.build(sp.from_storage(tuned.config), problem)
