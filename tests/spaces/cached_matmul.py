"""A numpy matmul space whose builds go through the on-disk kernel cache, as a GPU space's do.

A test fixture: ``build`` "compiles" a point into the kernel cache (a small file named by its key, written
through :meth:`evotune.measurement.kernel_cache.KernelCache.build_once`, so each cache compiles each point
once and counts it in its ``builds.log``), then loads it from there and returns ``fn(a, b) -> c``.
``tests/test_postgres.py`` runs two workers of it, each with a kernel cache of its own, on one study. With
``EVOTUNE_TEST_GATE`` set, each build first takes a token there, as ``gated.py`` (beside this file) builds.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from evotune.authoring import KernelCache, Point, Problem, SearchSpace, ordinal


def _take_token() -> None:
    """``gated.py``'s gate: loaded from its file, since spaces are loaded by path and are no package."""
    spec = importlib.util.spec_from_file_location("_evotune_test_gated", Path(__file__).with_name("gated.py"))
    assert spec is not None and spec.loader is not None
    gated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gated)
    gated._take_token()


def build(point: Point, problem: Problem) -> Any:
    if os.environ.get("EVOTUNE_TEST_GATE"):
        _take_token()
    cache = KernelCache()
    key = cache.key("cached_matmul", problem.key, sorted(point.items()))
    path = cache.path("numpy", key, ".json")

    def compile_it() -> None:
        path.write_text(json.dumps(point))
        cache.add(key, f"cached_matmul {problem.key} {point}", 0.0)

    cache.build_once(key, compile_it, lambda: cache.has(key) and path.is_file())
    repeats = int(json.loads(path.read_text())["repeats"])

    def fn(a: Any, b: Any) -> Any:
        c = a @ b
        for _ in range(repeats - 1):
            c = a @ b
        return c

    return fn


SPACE = SearchSpace("cached_matmul", [ordinal("repeats", (1, 2, 3, 4, 5, 6)), ordinal("split", (1, 2, 4, 8)),
                                      ordinal("unroll", (1, 2))], build=build)
