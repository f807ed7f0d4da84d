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

import contextvars
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from evotune.triton_tuning.resources import compile_config

if TYPE_CHECKING:
    from evotune.core.space import Point
    from evotune.triton_tuning.configs import TritonConfig

log = logging.getLogger("evotune.autotune")


def workers(count: int) -> int:
    """Threads for ``count`` compiles: one a core, at most one a configuration."""
    return max(1, min(count, os.cpu_count() or 1))


def pool_threads() -> int | None:
    """The threads a :class:`CompilePool` builds on, from ``EVOTUNE_COMPILE_THREADS`` (0: none, the search builds
    each point when it is measured); None: one a core."""
    text = os.environ.get("EVOTUNE_COMPILE_THREADS", "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"EVOTUNE_COMPILE_THREADS: {text!r} is not a whole number of threads (0: no pool)")
    return int(text)


def pool_depth(budget: int) -> int:
    """How many builds a search of ``budget`` evaluations keeps going side by side (threads, or processes:
    :mod:`evotune.triton_tuning.build_processes`): ``EVOTUNE_COMPILE_THREADS``, else one a core but at most a
    quarter of the budget (at least 2). The tuner keeps about 1.5 times that many proposals handed out, which the
    search makes before it hears their results: a deeper pool would leave a small budget's search little to learn
    from. Triton's compiler holds the GIL for part of each build, so threads past a few add little."""
    return pool_threads() or min(workers(os.cpu_count() or 1), max(2, budget // 4))


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


class PointBuilds(Protocol):
    """What builds a searched key's next proposals while the GPU times the built ones: :class:`CompilePool` (threads
    of this process) or :class:`~evotune.triton_tuning.build_processes.ProcessBuilds` (other processes)."""

    #: proposals the tuner keeps handed out to it
    depth: int
    #: points the search ranks next handed with each proposal to build on speculation (:meth:`speculate`)
    ahead: int
    #: whether builds not started can be dropped (:meth:`speculate`), so that it may build on speculation
    speculates: bool

    def submit(self, points: list[Point]) -> None: ...

    def speculate(self, points: list[Point]) -> None: ...

    def ready(self, point: Point) -> bool: ...

    def wait(self, point: Point) -> None: ...

    def close(self) -> None: ...

    def background(self, points: list[Point], on_built: Callable[[str], None]) -> None:
        """Build ``points`` (later keys' configurations) while idle; ``on_built(key)`` hears each one built."""


class CompilePool:
    """A search's proposals compiled side by side while the GPU times the ones built.

    A searched key is measured one point at a time, and each point's first launch compiles it: about a second of
    Triton's compiler against a few milliseconds of timing. The tuner hands this pool its next proposals
    (:meth:`submit`, as many as :attr:`depth` ahead); each goes to Triton's ``AsyncCompileMode`` at once, which
    builds it on a thread of the pool, and the tuner measures first the points whose build is done (:meth:`ready`).
    The mode is entered in a context of its own (``contextvars``), so the launches this thread times are not made
    asynchronous by it. A point's measurement waits for its build (:meth:`wait`); one that failed to build is built
    again by the measurement, which records why it fails. The few builds handed over and not measured when the key
    is decided are finished (:meth:`close`): an unfinished one would be found by a later launch of its configuration.

    Example::

        pool = CompilePool(fn, args, kwargs, lambda p: candidates.config(p), space.key)
        pool.submit(points); pool.ready(points[0]); pool.wait(points[0]); pool.close()
    """

    def __init__(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 config_of: Callable[[Point], TritonConfig], key_of: Callable[[Point], str],
                 threads: int | None = None):
        from triton import AsyncCompileMode

        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.config_of, self.key_of = config_of, key_of
        self.depth = threads or pool_threads() or workers(os.cpu_count() or 1)
        self.ahead = self.depth  # nothing is built on speculation (speculates is False)
        self._executor = ThreadPoolExecutor(self.depth, thread_name_prefix="evotune-compile")
        self._mode = AsyncCompileMode(self._executor, ignore_errors=True)
        self._context = contextvars.Context()
        self._context.run(self._mode.__enter__)
        self._kernels: dict[str, Any] = {}  # point key -> what the build returned (a FutureKernel while it runs)

    @classmethod
    def available(cls) -> bool:
        """Whether builds can run ahead here: a Triton with ``AsyncCompileMode``, not the interpreter, and
        ``EVOTUNE_COMPILE_THREADS`` not 0."""
        if os.environ.get("TRITON_INTERPRET") == "1" or pool_threads() == 0:
            return False
        try:
            from triton import AsyncCompileMode  # noqa: F401
        except ImportError:
            return False
        return True

    def submit(self, points: list[Point]) -> None:
        """Start building ``points`` (those not handed over before)."""
        for point in points:
            key = self.key_of(point)
            if key in self._kernels:
                continue
            try:
                self._kernels[key] = self._context.run(compile_config, self.fn, self.args, self.kwargs,
                                                       self.config_of(point))
            except Exception:  # the measurement builds it again and records why it fails
                self._kernels[key] = None

    #: a build handed to Triton's compile threads cannot be taken back: this pool builds only what is proposed
    speculates = False

    def speculate(self, points: list[Point]) -> None:
        """Only the proposals among ``points`` are built (it never runs: :attr:`speculates` is False)."""
        self.submit(points[:1])

    def ready(self, point: Point) -> bool:
        """Whether ``point`` can be measured without waiting for its build (always, when it was not handed over)."""
        future = getattr(self._kernels.get(self.key_of(point)), "future", None)
        return future is None or bool(future.done())

    def wait(self, point: Point) -> None:
        """Wait for ``point``'s build and put the kernel where its launch finds it (nothing for a failed build)."""
        _collect(self._kernels.get(self.key_of(point)))

    def background(self, points: list[Point], on_built: Callable[[str], None]) -> None:
        """Nothing: this pool's threads share the timing process's GIL, so building later keys' configurations here
        would slow the key being timed (the build processes do it: build_processes.py)."""

    def close(self) -> None:
        """Wait for the builds handed over and not measured (the tuner hands over no more than its budget, so these
        are few), so that no unfinished build is left where a later launch would find it."""
        for kernel in self._kernels.values():
            _collect(kernel)
        self._executor.shutdown(wait=True)
        self._kernels.clear()


def _collect(kernel: Any) -> None:
    """Finish a build handed to ``AsyncCompileMode``: the kernel goes where its launch finds it; a failed build is
    left for the measurement, which builds it again and records why it fails."""
    if getattr(kernel, "future", None) is None:
        return  # built before it was handed over, or not handed over, or collected already
    try:
        kernel.result(ignore_errors=True)
    except TypeError:  # a Triton whose result() takes no ignore_errors
        try:
            kernel.result()
        except Exception:
            pass
    except Exception:
        pass
