"""The timing oracle on a GPU: a capturable launch is sampled from one graph per batch, so the host's time
between launches cannot fall inside a sample; a launch that cannot be captured is launched directly."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from evotune.measurement.options import TimingOptions  # noqa: E402
from evotune.measurement.oracle import GraphLaunch, Oracle  # noqa: E402

SPIN = 20_000  # GPU cycles: about 10 µs


def test_a_slow_host_does_not_show_in_graph_samples() -> None:
    def launch() -> None:
        time.sleep(0.002)  # a host far slower than the kernel: 2 ms before every launch
        torch.cuda._sleep(SPIN)

    oracle = Oracle(TimingOptions(min_samples=20, max_samples=40))
    t = oracle.time(launch)
    assert t.graph
    assert len(t.samples_ms) >= 20
    assert 0 < t.median_ms < 0.2  # the spin, not the host's 2 ms


def test_each_batch_size_has_its_own_graph() -> None:
    oracle = Oracle()
    launch = oracle.prepare(lambda: torch.cuda._sleep(SPIN))
    assert isinstance(launch, GraphLaunch)
    assert len(oracle.sample(launch, 7)) == 7
    assert len(oracle.sample(launch, 3)) == 3
    assert len(oracle.sample(launch, 7)) == 7
    assert sorted(launch.batches) == [3, 7] and launch.graph


def test_a_launch_that_syncs_the_host_is_launched_directly() -> None:
    x = torch.ones(4, device="cuda")

    def launch() -> None:
        torch.cuda._sleep(SPIN)
        x.sum().item()  # a host sync: no graph can capture it

    t = Oracle(TimingOptions(min_samples=20, max_samples=40)).time(launch)
    assert not t.graph
    assert len(t.samples_ms) >= 20 and t.median_ms > 0
