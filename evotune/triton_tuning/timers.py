"""How a configuration's launch is timed: evotune's Oracle on a GPU, a user's ``do_bench``, or the wall clock.

Every timer takes a zero-argument ``call`` (one launch, with the hooks that protect
the outputs) and answers milliseconds; ``calls`` counts the timings it made, so that
a cached key can be seen to cost none.

* :class:`OracleTimer` (a GPU, no ``do_bench``): :class:`~evotune.measurement.oracle.Oracle`:
  CUDA graphs, a cold L2 before each sample, samples until the 95% CI of the median
  is tight; ``warmup`` launches first and at most ``rep`` ms of sampling per configuration;
* :class:`BenchTimer` (``do_bench`` given): Triton's call shape,
  ``do_bench(call, quantiles=(0.5, 0.2, 0.8))``, whose first figure is the median;
* :class:`WallClockTimer` (no GPU: the Triton interpreter): the median of a few
  launches timed with ``time.perf_counter``; it orders configurations by interpreter
  speed, which says nothing about a GPU, and exists so that the CPU path runs.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from evotune.measurement.options import ConfirmOptions, TimingOptions
from evotune.measurement.retiming import Confirmation, confirm_rounds

if TYPE_CHECKING:
    from evotune.measurement.oracle import Oracle

Call = Callable[[], object]
#: how the search times each configuration on a GPU: 10 to 200 samples, until the median's 95% CI is within 1%
SEARCH_TIMING = TimingOptions(min_samples=10, max_samples=200, ci_target=0.01)
#: the confirmation's warm-up on a GPU that has been idle (less after a search's evaluations: Oracle.warmup_for)
CONFIRM_WARMUP_S = 0.2


class Timer:
    """Times launches; ``measure`` for the search, ``samples`` for the side-by-side confirmation."""

    kind = "timer"

    def __init__(self) -> None:
        self.calls = 0

    def measure(self, call: Call) -> tuple[float, list[float]]:
        """(median ms, the samples it is the median of)."""
        self.calls += 1
        samples = self._samples(call, self.search_samples)
        return statistics.median(samples), samples

    def samples(self, call: Call, n: int) -> list[float]:
        self.calls += 1
        return self._samples(call, n)

    search_samples = 5

    def _samples(self, call: Call, n: int) -> list[float]:
        raise NotImplementedError

    def confirm_options(self, top_k: int) -> ConfirmOptions:
        """How the confirmation re-times the best few: short rounds, for a timer of whole-call figures."""
        return ConfirmOptions(top_k=top_k, per_round=3, min_rounds=2, max_rounds=4, ci_target=0.02,
                              max_seconds=30.0, warmup_s=0.0)

    def confirm(self, calls: dict[str, Call], search_ms: dict[str, float] | None = None) -> Confirmation:
        """``calls`` re-timed side by side in the confirmation's rounds (:func:`confirm_rounds`), with this timer's
        options for all of them and its warm-up, if it has one."""
        return confirm_rounds(list(calls), lambda name, n: self.samples(calls[name], n),
                              self.confirm_options(len(calls)), search_ms=search_ms, warm=getattr(self, "warm", None))


class WallClockTimer(Timer):
    kind = "wall-clock"

    def _samples(self, call: Call, n: int) -> list[float]:
        call()  # the first launch compiles (or rewrites, in the interpreter)
        out = []
        for _ in range(n):
            started = time.perf_counter()
            call()
            out.append((time.perf_counter() - started) * 1e3)
        return out


class BenchTimer(Timer):
    """A user's ``do_bench(call, quantiles)``, as ``triton.autotune`` calls it."""

    kind = "do_bench"

    def __init__(self, do_bench: Callable[..., Any]):
        super().__init__()
        self.do_bench = do_bench

    def measure(self, call: Call) -> tuple[float, list[float]]:
        self.calls += 1
        ms = self._one(call)
        return ms, [ms]

    def _one(self, call: Call) -> float:
        got = self.do_bench(call, quantiles=(0.5, 0.2, 0.8))
        return float(got[0] if isinstance(got, (list, tuple)) else got)

    def _samples(self, call: Call, n: int) -> list[float]:
        return [self._one(call) for _ in range(n)]

    def confirm_options(self, top_k: int) -> ConfirmOptions:
        """Each ``do_bench`` figure is already a median of many launches: one per configuration a round."""
        return ConfirmOptions(top_k=top_k, per_round=1, min_rounds=3, max_rounds=5, ci_target=0.02,
                              max_seconds=30.0, warmup_s=0.0)


class OracleTimer(Timer):
    """evotune's GPU oracle: CUDA graphs, cold L2, adaptive CI (see :mod:`evotune.measurement.oracle`)."""

    kind = "oracle"

    def __init__(self, warmup: int = 3, rep_ms: float = 100.0, timing: TimingOptions = SEARCH_TIMING):
        super().__init__()
        self._made = (timing, warmup, rep_ms)
        self._oracle: Oracle | None = None
        self._warmed: weakref.WeakSet[Call] = weakref.WeakSet()  # calls warmed up, forgotten with them

    @property
    def oracle(self) -> Oracle:
        """The oracle, made on first use: it makes this process's CUDA context and its L2 flush buffer on the GPU,
        which a process that only loads the kernel to build its configurations (a build process) must not, beside
        the timing process on the same GPU."""
        if self._oracle is None:
            from evotune.measurement.oracle import Oracle

            timing, warmup, rep_ms = self._made
            self._oracle = Oracle(timing, warmup=warmup, max_seconds=rep_ms / 1e3)
        return self._oracle

    def measure(self, call: Call) -> tuple[float, list[float]]:
        self.calls += 1
        t = self.oracle.time(call)
        return t.median_ms, t.samples_ms

    def _samples(self, call: Call, n: int) -> list[float]:
        if call not in self._warmed:
            self.oracle.warm(call)
            self._warmed.add(call)
        return self.oracle.round(call, n)  # a graph for these samples only (a hook's copies allocate in it)

    def confirm_options(self, top_k: int) -> ConfirmOptions:
        return ConfirmOptions(top_k=top_k, per_round=10, min_rounds=3, max_rounds=30, ci_target=0.005,
                              max_seconds=20.0, warmup_s=self.oracle.warmup_for(CONFIRM_WARMUP_S))

    def warm(self, seconds: float) -> None:
        torch = self.oracle.torch
        torch.cuda._sleep(int(seconds * 1.5e9))
        torch.cuda.synchronize()


def make_timer(do_bench: Callable[..., Any] | None, warmup: int, rep_ms: float) -> Timer:
    """The user's ``do_bench`` if given, else the Oracle on a GPU, else the wall clock (the interpreter)."""
    if do_bench is not None:
        return BenchTimer(do_bench)
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        try:
            import torch

            if torch.cuda.is_available():
                return OracleTimer(warmup, rep_ms)
        except ImportError:
            pass
    return WallClockTimer()
