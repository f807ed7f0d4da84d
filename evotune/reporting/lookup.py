"""The tuning-result cache and the runtime API: ``lookup(problem)`` and ``compile_best(problem)``.

The cache file and its format: :mod:`evotune.core.tuned_cache`. ``lookup`` answers from one
oracle's entries, GPU measurements unless told otherwise, so a replayed or CPU time never stands
for a measured one; ``config`` comes back as the space's kernel takes it (``(2, 1)`` for ``"2x1"``).

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

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evotune.core.problem import Problem
from evotune.core.tuned_cache import ORACLES, read_tuned, tuned_path


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
    from evotune.core.plugins import SpaceNotFound, load_space

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
    from evotune.core.plugins import load_space

    tuned = lookup(problem, space, hardware, path, oracle)
    sp = load_space(space_ref(tuned.source))
    if sp.build is None:
        raise ValueError(f"space {tuned.space!r} has no build function")
    return sp.build(tuned.config, problem)
