"""The oracle's batches without a GPU: one captured graph per batch size, replayed without calling the launch again;
a launch that a graph cannot capture is launched directly from then on. A stand-in for ``torch.cuda`` records
what runs: eager work runs at once, work launched while a graph captures goes into that graph."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from evotune.measurement.options import TimingOptions
from evotune.measurement.oracle import GraphLaunch, Oracle

KERNEL_MS = 0.01


class FakeCuda:
    def __init__(self) -> None:
        self.clock = 0.0  # the simulated GPU's time, ms
        self.capturing: FakeGraph | None = None
        self.spins = 0
        outer = self

        class Event:
            def __init__(self, enable_timing: bool = False, external: bool = False) -> None:
                self.at: float | None = None

            def record(self) -> None:
                outer.run(lambda: setattr(self, "at", outer.clock))

            def elapsed_time(self, other: Event) -> float:
                assert self.at is not None and other.at is not None
                return other.at - self.at

        self.Event = Event

    def run(self, op) -> None:
        """Run ``op`` now, or put it in the graph being captured."""
        if self.capturing is not None:
            self.capturing.ops.append(op)
        else:
            op()

    def kernel(self) -> None:
        self.run(lambda: setattr(self, "clock", self.clock + KERNEL_MS))

    def CUDAGraph(self) -> FakeGraph:
        return FakeGraph()

    @contextmanager
    def graph(self, g: FakeGraph):
        self.capturing = g
        try:
            yield
        finally:
            self.capturing = None

    def Stream(self) -> object:
        return FakeStream()

    def current_stream(self) -> FakeStream:
        return FakeStream()

    @contextmanager
    def stream(self, s: object):
        yield

    def synchronize(self) -> None:
        pass

    def _sleep(self, cycles: int) -> None:
        self.spins += 1


class FakeGraph:
    def __init__(self) -> None:
        self.ops: list = []
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for op in self.ops:
            op()


class FakeStream:
    def wait_stream(self, other: object) -> None:
        pass


class FakeTorch:
    def __init__(self) -> None:
        self.cuda = FakeCuda()


def oracle(**kw) -> Oracle:
    o = Oracle.__new__(Oracle)  # its __init__ reads a GPU: the stand-in above instead
    o.torch = FakeTorch()
    o.timing = TimingOptions(min_samples=kw.get("min_samples", 20), max_samples=kw.get("max_samples", 60))
    o.warmup, o.min_samples, o.max_samples = 1, o.timing.min_samples, o.timing.max_samples
    o.batch = min(20, o.min_samples)
    o.ci_target, o.max_seconds, o.use_graph = 0.01, 15.0, kw.get("use_graph", True)
    o._flush = o._sweep = o._sink = None
    return o


class Launch:
    """A kernel launch that counts its calls; with ``syncs``, it fails while a graph captures (a host sync)."""

    def __init__(self, cuda: FakeCuda, syncs: bool = False) -> None:
        self.cuda, self.syncs, self.calls = cuda, syncs, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.syncs and self.cuda.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.cuda.kernel()


def test_a_batch_is_captured_once_and_replayed_without_the_host() -> None:
    o = oracle()
    fn = Launch(o.torch.cuda)
    launch = o.prepare(fn)
    assert isinstance(launch, GraphLaunch)
    calls = fn.calls
    first = o.sample(launch, 5)
    assert fn.calls == calls + 1 + 5  # one eager launch on a side stream, then five captured
    second = o.sample(launch, 5)
    assert fn.calls == calls + 6  # replayed: the launch is not called again
    assert first == pytest.approx([KERNEL_MS] * 5) and second == pytest.approx([KERNEL_MS] * 5)
    assert launch.batches[5][0].replays == 2 and launch.graph


def test_each_batch_size_has_its_own_graph() -> None:
    o = oracle()
    launch = o.prepare(Launch(o.torch.cuda))
    assert len(o.sample(launch, 7)) == 7 and len(o.sample(launch, 3)) == 3
    assert sorted(launch.batches) == [3, 7]


def test_a_launch_no_graph_can_capture_is_launched_directly_from_then_on() -> None:
    o = oracle(min_samples=20, max_samples=40)
    fn = Launch(o.torch.cuda, syncs=True)
    t = o.time(fn)
    assert not t.graph
    assert t.samples_ms == pytest.approx([KERNEL_MS] * len(t.samples_ms))
    assert o.torch.cuda.spins == len(t.samples_ms) // o.batch  # each direct batch behind a spin
    launch = o.prepare(fn)
    o.sample(launch, 20)
    assert launch.batches == {20: None}
    o.sample(launch, 7)
    assert launch.batches == {20: None}  # not tried again for another size


def test_without_graphs_every_batch_is_launched_directly() -> None:
    o = oracle(use_graph=False)
    fn = Launch(o.torch.cuda)
    t = o.time(fn)
    assert not t.graph and o.torch.cuda.spins >= 1
    assert fn.calls == o.warmup + len(t.samples_ms)
