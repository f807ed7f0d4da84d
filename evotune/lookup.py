"""The tuning-result cache and the runtime API: ``lookup(problem)`` and ``compile_best(problem)``.

Every ``evotune run`` (and ``evotune best``) merges the best configuration of
each problem into one plain JSON file, so a program can ask for the best known
kernel without opening any study. The file (``$EVOTUNE_TUNED``, default
``~/.cache/evotune/tuned.json``) is a list of objects::

    {"space": "cute_hopper_gemm", "hardware": "NVIDIA H200", "oracle": "gpu",
     "problem_key": "gemm_bf16_tn_4096x4096x4096", "problem": {...},
     "config": {"tile_m": 128, "cluster": "2x1", ...}, "time_ms": 0.178,
     "experiment": "h100_bf16_gemm", "study": "...", "storage": "sqlite:///...", "updated": "2026-11-21"}

``oracle`` says what timed it: ``gpu`` (measured on the GPU named by ``hardware``),
``cpu`` (the CPU oracle: numpy kernels timed on the host) or ``replay`` (a recorded
landscape replayed: the times recorded on its device). Entries without one are
``gpu``. ``lookup`` answers from one oracle's entries, GPU measurements unless told
otherwise, so a replayed or CPU time never stands for a measured one. ``config`` is
kept as Optuna stores it (tuples as ``"2x1"``); ``lookup`` hands it back as the
space's kernel takes it (``(2, 1)``).

A problem that was never tuned falls back to the tuned problem in the nearest
bucket (the workload's: for a GEMM, powers of two with the same dtype and
layout), and the answer says so.

Example::

    import evotune
    hit = evotune.lookup(Problem.gemm(4000, 4096, 4096, "bf16"))
    hit.exact, hit.note, hit.config
    evotune.lookup(Problem.gemm(4096, 4096, 4096, "bf16"), oracle="replay")  # a replayed landscape's best
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

ORACLES = ("gpu", "cpu", "replay")


def tuned_path() -> Path:
    return Path(os.environ.get("EVOTUNE_TUNED", Path.home() / ".cache" / "evotune" / "tuned.json"))


@dataclass
class Tuned:
    space: str
    problem: Problem
    config: dict[str, Any]  # as the space's kernel takes it: tuples as tuples (as stored where the space is unknown)
    time_ms: float
    hardware: str | None
    exact: bool  # False when the answer comes from another problem's bucket
    note: str
    source: dict[str, Any]  # the cache's entry as stored
    oracle: str = "gpu"  # what timed it: gpu, cpu or replay


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
    """Merge ``report.Best`` rows into the cache: one entry per (space, hardware, oracle, problem), the fastest
    kept."""
    path = path or tuned_path()
    entries = {_entry_key(e): e for e in read_tuned(path)}
    today = _dt.date.today().isoformat()
    for b in rows:
        entry = {"space": b.space, "hardware": b.hardware, "oracle": b.oracle, "problem_key": b.problem_key,
                 "problem": b.problem, "config": b.config, "time_ms": b.time_ms, "experiment": b.experiment,
                 "study": b.study, "storage": storage, "updated": today}
        if getattr(b, "space_source", "") not in ("", b.space):  # a user's file: where compile_best finds it
            entry["space_source"] = b.space_source
        old = entries.get(_entry_key(entry))
        if old is not None and old["time_ms"] <= b.time_ms and old.get("study") != b.study:
            continue
        entries[_entry_key(entry)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(entries.values(), key=lambda e: (e["space"], e["problem_key"])), indent=1))
    tmp.replace(path)
    return path


def _entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
    return e["space"], e.get("hardware"), e.get("oracle", "gpu"), e["problem_key"]


def lookup(problem: Problem, space: str | None = None, hardware: str | None = None,
           path: Path | None = None, oracle: str = "gpu") -> Tuned:
    """The best known configuration for ``problem`` timed by ``oracle`` (``gpu``: measured on a GPU; ``cpu``;
    ``replay``: a recorded landscape's); raises LookupError when nothing comparable was tuned."""
    if oracle not in ORACLES:
        raise ValueError(f"oracle: expected one of {', '.join(ORACLES)}, got {oracle!r}")
    candidates = []
    for e in read_tuned(path):
        if (space and e["space"] != space) or (hardware and e.get("hardware") != hardware):
            continue
        if e.get("oracle", "gpu") != oracle:
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
                          + (f" in space {space}" if space else "") + f" timed by oracle {oracle!r}"
                          + f" (cache: {path or tuned_path()})")
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
    config, unknown = kernel_config(space_ref(e), e["config"])
    if unknown:
        note += f"; space {e['space']!r} cannot be loaded here ({unknown}): config as stored"
    return Tuned(e["space"], p, config, float(e["time_ms"]), e.get("hardware"), exact, note, e,
                 e.get("oracle", "gpu"))


def space_ref(entry: dict[str, Any]) -> str:
    """What loads an entry's space again: the file a user's space came from, else its name."""
    return str(entry.get("space_source") or entry["space"])


def kernel_config(space: str, stored: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``stored`` (Optuna's form) as space ``space``'s kernel takes it, each value decoded by its parameter
    (``"2x1"`` -> ``(2, 1)``); with the reason, ``stored`` itself when the space cannot be loaded (a replayed
    landscape's own space, a file of a user's)."""
    from evotune.plugins import SpaceNotFound, load_space

    try:
        params = {p.name: p for p in load_space(space).params}
    except (SpaceNotFound, ImportError) as exc:
        return dict(stored), ("not a built-in or installed space" if type(exc) is SpaceNotFound
                              else f"{type(exc).__name__}: {exc}")
    out = {}
    for name, value in stored.items():
        param = params.get(name)
        out[name] = param.from_storage(value) if param and value in param.storage_choices() else value
    return out, ""


def compile_best(problem: Problem, space: str | None = None, hardware: str | None = None,
                 path: Path | None = None, oracle: str = "gpu") -> Any:
    """A ready kernel ``fn(a, b, c)`` for ``problem`` built from its best known configuration."""
    from evotune.plugins import load_space

    tuned = lookup(problem, space, hardware, path, oracle)
    sp = load_space(space_ref(tuned.source))
    if sp.build is None:
        raise ValueError(f"space {tuned.space!r} has no build function")
    return sp.build(tuned.config, problem)
