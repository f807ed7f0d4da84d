"""Kernel Tuner cache files, read as recorded points: the other landscape format :mod:`evotune.core.landscape` reads.

A cache file (``tune_params``, ``tune_params_keys``, ``cache``) holds one entry per configuration Kernel Tuner
tried: its parameters, its time in milliseconds (and each run's), its compile and benchmark costs, or one of the
failure strings ``CompilationFailedConfig``, ``RuntimeFailedConfig`` and ``InvalidConfig``. The file names no data
type (see :func:`kernel_tuner_dtype`).

Example::

    cache = read_kernel_tuner(json.loads(path.read_text()))
    len(cache.entries), cache.problem.key
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Param, categorical, ordinal

FAILURES = {
    "CompilationFailedConfig": Status.COMPILE_ERROR,
    "RuntimeFailedConfig": Status.RUNTIME_ERROR,
    "InvalidConfig": Status.COMPILE_ERROR,
}
PRECISION = {16: "fp16", 32: "fp32", 64: "fp64"}  # CLBlast's PRECISION parameter: bits of the data type


class KernelTunerCacheError(ValueError):
    """A cache file's content that cannot be read as points; the message says what (its reader names the file)."""


@dataclass
class KernelTunerCache:
    """A cache file's points: the parameters, each configuration's result, the problem and what the file says of
    its recording (``meta``: device, kernel, problem size, objective)."""

    params: list[Param]
    entries: dict[tuple[Any, ...], EvalResult]
    problem: Problem
    meta: dict[str, Any]


def is_kernel_tuner(data: dict[str, Any]) -> bool:
    """Whether the JSON object ``data`` is a Kernel Tuner cache file."""
    return "cache" in data and "tune_params" in data


def kernel_tuner_names(data: dict[str, Any]) -> list[str]:
    """A Kernel Tuner cache file's parameter names, in its keys' order."""
    return data.get("tune_params_keys") or list(data["tune_params"])


def read_kernel_tuner(data: dict[str, Any]) -> KernelTunerCache:
    """The points of the cache file ``data``. KernelTunerCacheError for an entry without one of the parameters;
    a file of another shape raises what reading it meets (KeyError, TypeError, ...)."""
    keys = kernel_tuner_names(data)
    params = [_make_param(k, list(data["tune_params"][k])) for k in keys]
    entries: dict[tuple[Any, ...], EvalResult] = {}
    for cache_key, row in data["cache"].items():
        try:
            values = tuple(p.choices[p.index(row[p.name])] for p in params)
        except KeyError as exc:
            raise KernelTunerCacheError(f"cache entry {cache_key!r} lacks parameter {exc}") from exc
        t = row.get("time")
        compile_s = float(row.get("compile_time") or 0.0) / 1e3
        bench_s = (float(row.get("benchmark_time") or 0.0) + float(row.get("verification_time") or 0.0)) / 1e3
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            res = EvalResult(Status.OK, time_ms=float(t), samples_ms=[float(x) for x in row.get("times") or []],
                             compile_s=compile_s, bench_s=bench_s)
        else:
            status = FAILURES.get(str(t), Status.RUNTIME_ERROR)
            res = EvalResult(status, compile_s=compile_s, bench_s=bench_s, message=f"Kernel Tuner: {t}")
        entries[values] = res
    size = data.get("problem_size")
    label = "x".join(map(str, size)) if isinstance(size, list) else str(size if size is not None else "")
    problem = Problem(kind=str(data.get("kernel_name", "kernel")), label=label, dtype=kernel_tuner_dtype(data))
    meta = {"device": data.get("device_name", "?"), "kernel": data.get("kernel_name"),
            "problem_size": size, "source": "kernel_tuner", "objective": data.get("objective", "time")}
    return KernelTunerCache(params, entries, problem, meta)


def kernel_tuner_dtype(data: dict[str, Any]) -> str:
    """A Kernel Tuner cache's data type. The file names none: a kernel that is tuned over its precision (CLBlast's
    ``PRECISION``) says it by the one value it was recorded at; any other gets fp32, the float that the benchmark
    hub's kernels are written for (the file cannot tell)."""
    precision = data["tune_params"].get("PRECISION")
    if isinstance(precision, list) and len(precision) == 1 and precision[0] in PRECISION:
        return PRECISION[precision[0]]
    return "fp32"


def _make_param(name: str, values: list[Any]) -> Param:
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return ordinal(name, values) if numeric or all(isinstance(v, bool) for v in values) else categorical(name, values)
