"""Compiling a key's listed configurations side by side before they are timed one by one.

``triton.autotune`` compiles each configuration on its first timing, one after another: with a
list of a dozen configurations the first call of a new key is mostly compiling. Triton's
``AsyncCompileMode`` hands each compile to an executor instead, so :func:`compile_ahead` submits them
all to a thread pool and waits, and the timing that follows finds every kernel built. The compiles
overlap: on an H100 the first call of a 12-configuration key from an empty Triton cache took 3.82 s,
confirmation included, against ``triton.autotune``'s 5.49 s (benchmarks/RESULTS.md). A
configuration that does not compile is left to the measurement, which compiles it again and records
why it failed. Nothing is done under the interpreter (it compiles nothing) or with a Triton that
lacks ``AsyncCompileMode``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from evotune.triton_tuning.resources import compile_config

if TYPE_CHECKING:
    from evotune.triton_tuning.configs import TritonConfig

log = logging.getLogger("evotune.autotune")


def workers(count: int) -> int:
    """Threads for ``count`` compiles: one a core, at most one a configuration."""
    return max(1, min(count, os.cpu_count() or 1))


def compile_ahead(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], configs: Sequence[TritonConfig]) -> float:
    """Build ``configs`` of the jitted ``fn`` for this launch in parallel; the seconds it took (0: nothing done)."""
    if len(configs) < 2 or os.environ.get("TRITON_INTERPRET") == "1":
        return 0.0
    try:
        from triton import AsyncCompileMode
    except ImportError:
        return 0.0
    started = time.perf_counter()
    with ThreadPoolExecutor(workers(len(configs))) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for config in configs:
            try:
                compile_config(fn, args, kwargs, config)
            except Exception:  # the measurement compiles it again and records why it fails
                continue
    seconds = time.perf_counter() - started
    log.info("compiled %d configurations ahead in %.2f s", len(configs), seconds)
    return seconds
