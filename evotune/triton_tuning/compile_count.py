"""Triton's compiles for this process, counted while a key is tuned: how many configurations the compiler built
(here, or in this process's build processes: :mod:`evotune.triton_tuning.build_processes`) and how many it found in
the on-disk cache (built for an earlier key, by any worker of the host: the run points every worker at one
``TRITON_CACHE_DIR``). A configuration already loaded in this process costs neither.

It listens through Triton's compilation listener (``triton.knobs.compilation.listener``), called once per compile
with ``cache_hit``; a listener set before is still called. The interpreter compiles nothing: no count
(:attr:`CompileCount.counted` False)."""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import Any


class _Built:
    """How many configurations this process's build processes compiled (not found in the cache), over its life."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n


#: the build processes' compiles (:mod:`evotune.triton_tuning.build_processes` adds each one it hears of)
BUILT = _Built()


class CompileCount:
    """``with CompileCount() as count:`` ... ``count.built``, ``count.loaded``."""

    def __init__(self) -> None:
        self.built = 0
        self.loaded = 0
        self.counted = os.environ.get("TRITON_INTERPRET") != "1"
        self._lock = threading.Lock()  # compiles run on a thread pool (compile_ahead)
        self._knobs: Any = None
        self._before: Any = None
        self._elsewhere = BUILT.count  # the build processes' count when this one started

    def _heard(self, *args: Any, cache_hit: bool = False, **kwargs: Any) -> None:
        with self._lock:
            if cache_hit:
                self.loaded += 1
            else:
                self.built += 1
        if self._before is not None:
            self._before(*args, cache_hit=cache_hit, **kwargs)

    def __enter__(self) -> CompileCount:
        if self.counted:
            try:
                from triton import knobs
            except ImportError:  # a Triton without knobs: nothing is counted
                self.counted = False
                return self
            self._knobs = knobs
            self._before = knobs.compilation.listener
            knobs.compilation.listener = self._heard
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._knobs is not None:
            self._knobs.compilation.listener = self._before
            self._knobs = None

    @property
    def elsewhere(self) -> int:
        """Configurations the build processes compiled since this count started (this process then loads them)."""
        return BUILT.count - self._elsewhere

    @property
    def compiles(self) -> int | None:
        """Configurations the compiler built, here or in the build processes; None where nothing is counted (the
        interpreter)."""
        return self.built + self.elsewhere if self.counted else None

    @property
    def loads(self) -> int | None:
        """Configurations found built in the on-disk cache by an earlier key; None where nothing is counted."""
        return max(0, self.loaded - self.elsewhere) if self.counted else None
