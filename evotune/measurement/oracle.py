"""The timing oracle: CUDA events around single launches, a cold L2 before each, adaptive repeats.

Method (see benchmarks/RESULTS.md for what it measured):

1. warm up (module load, JIT, handle creation stay out of the numbers);
2. capture the launch in a CUDA graph when it can be captured: a whole batch
   of samples (step 4, ``n`` times) is one graph, replayed at once, so nothing
   the host does (launch overhead, other processes compiling on its cores)
   can fall inside a sample; a launch that cannot be captured is launched
   directly;
3. before every sample, empty the L2 (``timing.flush``), so each sample
   reads its inputs from HBM as a real layer would: ``"dirty"`` overwrites a
   buffer twice the size of L2, as Triton's ``do_bench`` does, and leaves the
   L2 full of dirty lines that the timed kernel writes back as it evicts them;
   ``"clean"`` then also reads a second such buffer, which leaves the L2 as
   cold and holding clean lines only (see :meth:`Oracle.empty_l2`);
4. one sample = CUDA events recorded right before and after one launch; a
   batch launched directly is queued behind a short GPU spin, so the host is
   mostly ahead of the GPU;
5. take samples in batches until the 95% confidence interval of the median
   (distribution-free, from order statistics) is within ``timing.ci_target``
   of it, or ``timing.max_samples`` / ``max_seconds`` is reached;
6. drop outliers outside Tukey's fences (1.5 IQR) for the summary; keep every
   sample in the record.

The same oracle times candidates and baselines (cuBLAS through torch), in the same process.

Example::

    oracle = Oracle()
    t = oracle.time(lambda: torch.matmul(a, b, out=c))
    t.median_ms, t.ci95_rel, len(t.samples_ms)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from evotune.core.flush import FLUSHES
from evotune.measurement.options import TimingOptions

HEAD_START_CYCLES = 100_000  # GPU cycles of head start per queued sample (about 50 µs at 2 GHz)


@dataclass(eq=False)
class GraphLaunch:
    """A launch to sample from CUDA graphs (what :meth:`Oracle.capture` returns while ``use_graph`` is on).
    Calling it launches ``fn``. :meth:`Oracle.sample` takes its samples from ``batches``: one graph per batch
    size holding the whole batch (cold L2, start event, ``fn``, end event; ``n`` times), captured at first use
    and released with this; None once ``fn`` could not be captured, and its batches are then launched directly."""

    fn: Callable[[], object]
    batches: dict[int, tuple[Any, list[Any], list[Any]] | None] = field(default_factory=dict)

    def __call__(self) -> object:
        return self.fn()

    @property
    def graph(self) -> bool:
        """Whether its samples come from graphs: it was captured, and never failed to be."""
        return bool(self.batches) and None not in self.batches.values()


@dataclass
class Timing:
    samples_ms: list[float]  # every sample, in the order taken
    median_ms: float  # median of the samples inside Tukey's fences
    ci95_ms: tuple[float, float]  # 95% confidence interval of that median
    trimmed: int  # samples outside the fences
    graph: bool  # whether the launch was replayed from a CUDA graph
    bench_s: float  # wall time spent measuring, warm-up included
    notes: list[str] = field(default_factory=list)

    @property
    def ci95_rel(self) -> float:
        return ci_half_width(self.median_ms, self.ci95_ms)


def ci_half_width(median: float, ci: tuple[float, float] | list[float]) -> float:
    """Half the width of a confidence interval, as a fraction of the median it is around."""
    return (ci[1] - ci[0]) / 2.0 / median


def summarize(samples: list[float]) -> tuple[float, tuple[float, float], int]:
    """Median inside Tukey's fences, its 95% CI from order statistics, and how many were trimmed."""
    x = np.sort(np.asarray(samples, dtype=float))
    q1, q3 = np.percentile(x, [25, 75])
    iqr = q3 - q1
    kept = x[(x >= q1 - 1.5 * iqr) & (x <= q3 + 1.5 * iqr)]
    n = len(kept)
    med = float(np.median(kept))
    half = 1.96 * math.sqrt(n) / 2.0
    lo = kept[max(math.floor(n / 2.0 - half) - 1, 0)]
    hi = kept[min(math.ceil(n / 2.0 + half), n - 1)]
    return med, (float(lo), float(hi)), len(x) - n


class Oracle:
    """Times a zero-argument callable that launches GPU work on the current torch stream."""

    def __init__(self, timing: TimingOptions | None = None, *, warmup: int = 3, batch: int = 20,
                 max_seconds: float = 15.0, use_graph: bool = True, flush_l2: bool = True):
        import torch

        self.torch = torch
        timing = timing or TimingOptions()
        if timing.flush not in FLUSHES:
            raise ValueError(f"flush must be one of {', '.join(FLUSHES)}, got {timing.flush!r}")
        self.timing = timing
        self.warmup, self.min_samples, self.max_samples = warmup, timing.min_samples, timing.max_samples
        self.batch = min(batch, timing.min_samples)  # a first batch larger than asked for would waste samples
        self.ci_target, self.max_seconds, self.use_graph = timing.ci_target, max_seconds, use_graph
        self._flush = self._sweep = self._sink = None
        self.sampled_at: float | None = None  # time.perf_counter() when the last samples were read back
        if flush_l2:
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
            self._flush = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
            if timing.flush == "clean":
                # int64 summed as int64: a sum that widens int32 to int64 reads at about a fifth of the HBM's
                # bandwidth, and the flush is most of a small kernel's sample
                self._sweep = torch.ones(2 * l2 // 8, dtype=torch.int64, device="cuda")
                self._sink = torch.empty((), dtype=torch.int64, device="cuda")

    def empty_l2(self) -> None:
        """Evict the L2 before a sample, the way ``timing.flush`` says.

        Both flushes first overwrite a buffer twice the L2's size: stores allocate lines whatever the
        replacement policy and whatever the L2 still holds, so nothing of the timed kernel's data (inputs,
        or the outputs of the sample before) survives it. That leaves the L2 full of dirty lines, and
        ``"dirty"`` stops there: the timed kernel's first misses then wait for their write-back. ``"clean"``
        then reads a second buffer of twice the L2's size (a sum into one scalar). Its loads miss (the
        writes just evicted it), so each one evicts a dirty line and the write-back happens here, before the
        sample; what is left is the read buffer's clean lines, which the timed kernel evicts for free. A
        read-only sweep alone could hit lines still resident from the sweep before, and hits evict nothing:
        how much of the timed kernel's data it evicted would depend on the L2's replacement policy.
        """
        if self._flush is None:
            return
        self._flush.zero_()
        if self._sweep is not None:
            self.torch.sum(self._sweep, dim=0, out=self._sink)

    def _batch_graph(self, fn: Callable[[], object], n: int, first: bool) -> tuple[Any, list[Any], list[Any]] | None:
        """One CUDA graph of ``n`` samples of ``fn`` (cold L2, start event, ``fn``, end event, ``n`` times) and its
        events, or None when ``fn`` cannot be captured (a host sync, an allocation a graph cannot hold, a
        launcher that pins a stream). The events are external: the graph's replay records them. Before the
        ``first`` capture of ``fn``, one eager launch on a side stream, as torch recommends."""
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(n)]
        try:
            if first:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    fn()
                torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for s, e in zip(starts, ends, strict=True):
                    self.empty_l2()
                    s.record()
                    fn()
                    e.record()
            torch.cuda.synchronize()
            return graph, starts, ends
        except Exception:
            torch.cuda.synchronize()
            return None

    def warm(self, fn: Callable[[], object]) -> None:
        """Launch ``fn`` ``warmup`` times (its first launches compile, allocate, pick algorithms) and wait."""
        for _ in range(self.warmup):
            fn()
        self.torch.cuda.synchronize()

    def prepare(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Warm ``fn`` up: the launch to time (:meth:`capture`)."""
        self.warm(fn)
        return self.capture(fn)

    def capture(self, fn: Callable[[], object]) -> Callable[[], object]:
        """The launch to time for a warmed-up ``fn``: a :class:`GraphLaunch` (its batches captured when sampled,
        where a graph can capture ``fn``), or ``fn`` itself when ``use_graph`` is off."""
        return GraphLaunch(fn) if self.use_graph else fn

    def round(self, fn: Callable[[], object], n: int) -> list[float]:
        """``n`` samples of a warmed-up ``fn`` from a graph captured for them and released after them: how the
        confirmation times each item's round. Graphs kept side by side are not independent: one's memory
        allocated during its capture (a library call's output or workspace, as torch's cuDNN convolution
        allocates) is not reliably kept once others are captured after it; on an H100 a cuDNN baseline's graph
        faulted with an illegal address on replay once a CUTLASS kernel's graph had been captured after it."""
        return self.sample(self.capture(fn), n)

    def sample(self, launch: Callable[[], object], n: int) -> list[float]:
        """``n`` samples (ms) of a prepared launch, each its own pair of CUDA events after a cold L2."""
        torch = self.torch
        if isinstance(launch, GraphLaunch):
            if n not in launch.batches and None not in launch.batches.values():
                launch.batches[n] = self._batch_graph(launch.fn, n, first=not launch.batches)
            if (batch := launch.batches.get(n)) is not None:
                graph, starts, ends = batch
                graph.replay()
                torch.cuda.synchronize()
                self.sampled_at = time.perf_counter()
                return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        # Keep the GPU busy while this thread queues the batch: a sample is the GPU time between its two
        # events, and a host delayed between recording the first and launching (other processes compiling
        # on the same cores, say) would leave the GPU idle inside the sample and inflate it.
        torch.cuda._sleep(HEAD_START_CYCLES * n)
        for s, e in zip(starts, ends, strict=True):
            self.empty_l2()
            s.record()
            launch()
            e.record()
        torch.cuda.synchronize()
        self.sampled_at = time.perf_counter()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]

    def warmup_for(self, warmup_s: float) -> float:
        """The warm-up a confirmation needs before its rounds: ``warmup_s`` to bring an idle GPU's clocks up, but no
        longer than the GPU has been idle since this oracle's last samples (a search's evaluations just before
        kept it at its working clocks; a key's confirmation follows them within a fraction of a second)."""
        if self.sampled_at is None:
            return warmup_s
        return max(0.0, min(warmup_s, time.perf_counter() - self.sampled_at))

    def time(self, fn: Callable[[], object]) -> Timing:
        started = time.perf_counter()
        launch = self.prepare(fn)
        samples: list[float] = []
        notes = []
        while True:
            samples += self.sample(launch, self.batch)
            if len(samples) < self.min_samples:
                continue
            med, ci, _ = summarize(samples)
            if ci_half_width(med, ci) <= self.ci_target:
                break
            if len(samples) >= self.max_samples:
                notes.append(f"stopped at {len(samples)} samples before the CI reached {self.ci_target:.0%}")
                break
            if time.perf_counter() - started > self.max_seconds:
                notes.append(f"stopped after {self.max_seconds:.0f} s before the CI reached {self.ci_target:.0%}")
                break
        med, ci, trimmed = summarize(samples)
        graph = isinstance(launch, GraphLaunch) and launch.graph
        return Timing(samples, med, ci, trimmed, graph, time.perf_counter() - started, notes)

    def copy_bandwidth_gbps(self, nbytes: int = 2 * 2**30) -> float:
        """Measured device-to-device bandwidth, counting bytes read plus bytes written.

        An elementwise kernel, not ``copy_``: captured in a graph, a plain copy becomes a
        memcpy node that may run on a copy engine, slower than the SMs' own loads and stores.
        """
        torch = self.torch
        src = torch.ones(nbytes // 8, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        t = self.time(lambda: torch.neg(src, out=dst))
        return nbytes / (t.median_ms * 1e-3) / 1e9

    def read_bandwidth_gbps(self, nbytes: int = 2**30) -> float:
        """Achievable read bandwidth: the bytes of a ``nbytes`` sum over its time, after a clean flush
        (whatever this oracle's own flush), so no write-back is counted against the reads."""
        torch = self.torch
        oracle = self if self.timing.flush == "clean" else Oracle(
            replace(self.timing, flush="clean"), warmup=self.warmup, max_seconds=self.max_seconds,
            use_graph=self.use_graph)
        src = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        sink = torch.empty((), dtype=torch.float32, device="cuda")
        t = oracle.time(lambda: torch.sum(src, dim=0, out=sink))
        return nbytes / (t.median_ms * 1e-3) / 1e9
