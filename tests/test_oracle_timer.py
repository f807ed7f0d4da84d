"""evotune.autotune's OracleTimer in the confirmation: each round from a graph of its own, each call warmed up once
and not held after it is gone (a call holds the launch's tensors). The oracle here is a stand-in that counts."""

from __future__ import annotations

import gc

from evotune.triton_tuning.timers import OracleTimer


class CountingOracle:
    def __init__(self) -> None:
        self.warmed = self.rounds = 0

    def warm(self, fn) -> None:
        self.warmed += 1
        fn()

    def round(self, fn, n):
        self.rounds += 1
        return [float(fn()) for _ in range(n)]


def _timer() -> OracleTimer:
    timer = OracleTimer()  # its GPU oracle is made on first use: the stand-in above instead
    timer._oracle = CountingOracle()
    return timer


def test_each_round_captures_its_own_graph_and_each_call_is_warmed_up_once() -> None:
    timer = _timer()

    def call() -> float:
        return 0.5

    assert timer.samples(call, 3) == [0.5, 0.5, 0.5]
    assert timer.samples(call, 2) == [0.5, 0.5]
    assert timer.oracle.warmed == 1  # warmed up once
    assert timer.oracle.rounds == 2  # one graph per round


def test_a_call_that_is_gone_is_not_held() -> None:
    timer = _timer()

    def make():
        data = [1.0] * 10

        def call() -> float:
            return data[0]

        return call

    call = make()
    timer.samples(call, 1)
    assert len(timer._warmed) == 1
    del call
    gc.collect()
    assert len(timer._warmed) == 0
