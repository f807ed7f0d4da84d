"""Compiling a key's listed configurations ahead (evotune/triton_tuning/compile_ahead.py): every configuration not yet
measured is handed to Triton's AsyncCompileMode once, before the timing; failures are left to the measurement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evotune.core.result import EvalResult, Status
from evotune.core.space import FeasibleSet, Point, SearchSpace, ordinal
from evotune.triton_tuning.cache import DecisionStore, KernelId
from evotune.triton_tuning.compile_ahead import compile_ahead, workers
from evotune.triton_tuning.search import KeyJob, tune_key
from evotune.triton_tuning.timers import WallClockTimer

triton = pytest.importorskip("triton")


class Config:
    def __init__(self, block: int) -> None:
        self.block = block

    def all_kwargs(self) -> dict[str, Any]:
        return {"BLOCK": self.block, "num_warps": 4}


class FakeJit:
    """Records what it is asked to build, and whether Triton's async mode was on; BLOCK 64 does not compile."""

    def __init__(self) -> None:
        self.built: list[tuple[tuple[Any, ...], dict[str, Any], bool]] = []

    def warmup(self, *args: Any, **kwargs: Any) -> None:
        from triton.runtime import _async_compile

        self.built.append((args, kwargs, _async_compile.active_mode.get() is not None))
        if kwargs["BLOCK"] == 64:
            raise RuntimeError("out of resources")


def test_every_config_is_built_in_async_mode_with_the_launch_and_failures_are_left(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fn = FakeJit()
    seconds = compile_ahead(fn, ("a", 3), {"grid": (1,), "warmup": False}, [Config(16), Config(64), Config(32)])
    assert seconds > 0
    assert [(args, kw["BLOCK"], kw["grid"], async_on) for args, kw, async_on in fn.built] == [
        (("a", 3), 16, (1,), True), (("a", 3), 64, (1,), True), (("a", 3), 32, (1,), True)]
    assert all("warmup" not in kw for _, kw, _ in fn.built)  # Triton's warmup() takes no warmup flag


def test_nothing_is_built_for_one_config_or_under_the_interpreter(monkeypatch) -> None:
    fn = FakeJit()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert compile_ahead(fn, (), {}, [Config(16)]) == 0.0
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert compile_ahead(fn, (), {}, [Config(16), Config(32)]) == 0.0
    assert fn.built == []


def test_workers_one_a_core_at_most_one_a_config(monkeypatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert (workers(3), workers(40), workers(0)) == (3, 16, 1)


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_list_is_built_ahead_once_without_the_points_already_measured(tmp_path: Path, storage: str) -> None:
    space = SearchSpace("blocks", [ordinal("BLOCK", (16, 32, 64, 128))])
    feasible = FeasibleSet.from_codes(space, [space.encode({"BLOCK": b}) for b in (16, 32, 64, 128)])
    listed: list[Point] = [{"BLOCK": b} for b in (128, 16, 64, 32)]
    url = f"sqlite:///{tmp_path}/c.db" if storage == "sqlite" else f"journal:{tmp_path}/c.journal"
    cache = DecisionStore(url, KernelId("k", "0" * 16, "3", "cpu"))
    asked: list[list[int]] = []
    timed: list[int] = []

    def measure(p: Point) -> EvalResult:
        timed.append(p["BLOCK"])
        return EvalResult(Status.OK, 1.0 + abs(p["BLOCK"] - 32) / 100)

    def job(points: list[Point], budget: int) -> KeyJob:
        return KeyJob(cache, {"M": 8}, space, feasible, points, budget, measure, lambda p: lambda: None,
                      WallClockTimer(), confirm=1, compile_ahead=lambda ps: asked.append([p["BLOCK"] for p in ps]))

    tune_key(job(listed[:2], budget=8))
    assert asked == [[128, 16]] and timed == [128, 16]
    tune_key(job(listed, budget=8))  # the list grew: only the two new points are built and timed
    assert asked[1:] == [[64, 32]] and timed[2:] == [64, 32]
