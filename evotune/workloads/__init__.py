"""Finding workloads (problem kinds): built-ins in this package, then the ``evotune.workloads`` entry points.

A workload module defines ``WORKLOAD``, an instance of
:class:`evotune.workloads.base.Workload` whose ``kind`` is what a ``[[problem]]``
table names (``kind = "conv2d"``); an entry point of the group
``evotune.workloads`` names such an instance (or a module that defines one).

Example::

    from evotune.workloads import get_workload
    get_workload("gemm").key(Problem.gemm(64, 64, 64))   # 'gemm_bf16_tn_64x64x64'
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from importlib.metadata import entry_points

from evotune.workloads.base import FieldError, Workload

ENTRY_POINT_GROUP = "evotune.workloads"
_NOT_WORKLOADS = {"base"}

__all__ = ["FieldError", "Workload", "WorkloadNotFound", "find_workload", "get_workload", "workload_names"]


class WorkloadNotFound(LookupError):
    pass


def _builtin_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if not m.name.startswith("_") and m.name not in _NOT_WORKLOADS)


def _workload_of(obj: object, name: str) -> Workload:
    obj = getattr(obj, "WORKLOAD", obj)
    if not isinstance(obj, Workload):
        raise WorkloadNotFound(f"{name} is not an evotune.workloads.base.Workload")
    return obj


@functools.cache
def _registry() -> dict[str, Workload]:
    found: dict[str, Workload] = {}
    for name in _builtin_modules():
        w = _workload_of(importlib.import_module(f"evotune.workloads.{name}"), name)
        found[w.kind] = w
    return found


def workload_names() -> list[str]:
    """Every kind a [[problem]] table may name: built-ins and entry points."""
    return sorted({*_registry(), *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


@functools.cache
def find_workload(kind: str) -> Workload | None:
    """The workload of ``kind``, or None (a recorded kernel of another kind is no workload)."""
    if kind in _registry():
        return _registry()[kind]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == kind:
            return _workload_of(ep.load(), kind)
    return None


def get_workload(kind: str) -> Workload:
    """The workload of ``kind``; raises :class:`WorkloadNotFound`."""
    w = find_workload(kind)
    if w is None:
        raise WorkloadNotFound(f"unknown workload {kind!r}; accepted: {', '.join(workload_names())}")
    return w
