"""The CPU side of benchmarks/timing_under_load.py: its rows, and its one-line errors."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture
def bench(monkeypatch):
    return load_benchmark("timing_under_load", monkeypatch)


def test_a_row_gives_the_time_a_sample_takes_and_how_the_samples_spread(bench):
    # two points: 40 samples in 12 ms and 60 in 24 ms; each point's samples 0.9, 1.0 (x38 or x58), 1.2 of 6 µs
    timed = [(0.012 / 40, 40, 0.006, [0.0054] + [0.006] * 38 + [0.0072]),
             (0.024 / 60, 60, 0.006, [0.0054] + [0.006] * 58 + [0.0072])]
    row = bench.summary("cpu30", 30, timed)
    assert row["condition"] == "cpu30" and row["loads"] == 30
    assert row["sample_ms"] == pytest.approx(0.35)  # the median of 0.30 and 0.40 ms
    assert row["samples"] == 50
    assert row["spread"] == pytest.approx(0.0)  # the middle half of each point is 6 µs exactly
    assert row["p01"] == pytest.approx(0.9, abs=0.02) and row["p99"] == pytest.approx(1.2, abs=0.05)
    assert row["median_ms"] == pytest.approx(0.006)


@pytest.mark.parametrize(("args", "field"), [(["--shape", "512x16"], "--shape"),
                                             (["--conditions", "idle,cpux"], "--conditions"),
                                             (["--conditions", "gpu+disk"], "--conditions")])
def test_a_bad_argument_is_one_line_naming_it_and_exit_2(bench, capsys, args, field):
    assert bench.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"timing_under_load.py: {field}:")
