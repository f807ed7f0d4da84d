"""A search's proposals built side by side while others are timed (evotune/triton_tuning/compile_ahead.py,
CompilePool): builds run on the pool's threads through Triton's AsyncCompileMode without making this thread's
launches asynchronous, a point's measurement waits for its build, a failed build is left to the measurement, and the
tuner hands the pool no more points than the budget can measure."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

import pytest

from evotune.core.result import EvalResult, Status
from evotune.core.space import FeasibleSet, Point, SearchSpace, ordinal
from evotune.triton_tuning.cache import DecisionStore, KernelId
from evotune.triton_tuning.compile_ahead import CompilePool, pool_threads
from evotune.triton_tuning.search import KeyJob, tune_key
from evotune.triton_tuning.timers import WallClockTimer

triton = pytest.importorskip("triton")
pytest.importorskip("triton.runtime._async_compile")


class Config:
    def __init__(self, block: int) -> None:
        self.block = block

    def all_kwargs(self) -> dict[str, Any]:
        return {"BLOCK": self.block, "num_warps": 4}


class AsyncJit:
    """Builds as a jitted function does: under Triton's async mode the build goes to the mode's executor and a
    placeholder is returned; the finished kernel lands in ``kernel_cache``. BLOCK 64 does not build; a build waits
    for ``release`` first."""

    def __init__(self) -> None:
        self.kernel_cache: dict[int, Any] = {}
        self.threads: set[str] = set()
        self.release = threading.Event()
        self.async_in_caller: list[bool] = []

    def warmup(self, *args: Any, **kwargs: Any) -> Any:
        from triton.runtime import _async_compile

        block = kwargs["BLOCK"]

        def build() -> str:
            self.threads.add(threading.current_thread().name)
            self.release.wait()
            if block == 64:
                raise RuntimeError("out of resources")
            return f"kernel{block}"

        mode = _async_compile.active_mode.get()
        if mode is None:
            self.kernel_cache[block] = build()
            return self.kernel_cache[block]
        callbacks: list[Any] = [lambda kernel: self.kernel_cache.__setitem__(block, kernel)]
        if "cleanup_fn" in inspect.signature(mode.submit).parameters:
            callbacks.append(lambda placeholder: None)
        return mode.submit(block, build, *callbacks)


def point(block: int) -> Point:
    return {"BLOCK": block}


def make_pool(fn: AsyncJit, threads: int = 4) -> CompilePool:
    return CompilePool(fn, (), {"grid": (1,)}, lambda p: Config(p["BLOCK"]), lambda p: str(p["BLOCK"]), threads)


def test_builds_run_on_the_pool_and_a_measurement_waits_for_its_own(monkeypatch) -> None:
    from triton.runtime import _async_compile

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fn = AsyncJit()
    pool = make_pool(fn)
    pool.submit([point(16), point(32), point(64)])
    assert _async_compile.active_mode.get() is None  # this thread's launches stay synchronous
    assert not pool.ready(point(16)) and pool.ready(point(128))  # 128 was never handed over: built when measured
    fn.release.set()
    pool.wait(point(16))
    assert pool.ready(point(16)) and fn.kernel_cache == {16: "kernel16"}
    pool.wait(point(64))  # a failed build is not raised: the measurement builds it again and records why
    assert 64 not in fn.kernel_cache
    pool.close()  # the build not measured is finished, not left half-done for a later launch
    assert fn.kernel_cache == {16: "kernel16", 32: "kernel32"}
    assert fn.threads and all(name.startswith("evotune-compile") for name in fn.threads)


def test_a_point_handed_over_twice_is_built_once(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fn = AsyncJit()
    fn.release.set()
    calls: list[int] = []
    original = fn.warmup
    fn.warmup = lambda *a, **k: (calls.append(k["BLOCK"]), original(*a, **k))[1]  # type: ignore[method-assign]
    pool = make_pool(fn)
    pool.submit([point(16), point(32)])
    pool.submit([point(32), point(128)])
    pool.close()
    assert calls == [16, 32, 128]


def test_the_pool_is_off_under_the_interpreter_and_with_zero_threads(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("EVOTUNE_COMPILE_THREADS", raising=False)
    assert CompilePool.available() and pool_threads() is None
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "6")
    assert pool_threads() == 6 and make_pool(AsyncJit(), threads=0).depth == 6
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "0")
    assert not CompilePool.available()
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "many")
    with pytest.raises(ValueError, match="EVOTUNE_COMPILE_THREADS: 'many'"):
        pool_threads()
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "4")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not CompilePool.available()


class RecordingPool:
    """Stands in for CompilePool in a search: records what it is handed and waited on."""

    depth = ahead = 4
    speculates = False  # as CompilePool: a build handed over is not taken back

    def __init__(self) -> None:
        self.submitted: list[int] = []
        self.waited: list[int] = []
        self.closed = False

    def submit(self, points: list[Point]) -> None:
        self.submitted += [p["BLOCK"] for p in points]

    def speculate(self, points: list[Point]) -> None:  # pragma: no cover - never called: it does not speculate
        raise AssertionError("a pool that cannot take builds back is handed no speculation")

    def ready(self, point: Point) -> bool:
        return True

    def wait(self, point: Point) -> None:
        self.waited.append(point["BLOCK"])

    def close(self) -> None:
        self.closed = True


def test_a_search_hands_its_pool_no_more_than_its_budget_and_waits_before_each_measurement(tmp_path: Path) -> None:
    blocks = list(range(16, 16 * 41, 16))
    space = SearchSpace("blocks", [ordinal("BLOCK", tuple(blocks))])
    feasible = FeasibleSet.from_codes(space, [space.encode(point(b)) for b in blocks])
    cache = DecisionStore(f"sqlite:///{tmp_path}/c.db", KernelId("k", "0" * 16, "3", "cpu"))
    pool = RecordingPool()
    timed: list[int] = []

    def measure(p: Point) -> EvalResult:
        timed.append(p["BLOCK"])
        return EvalResult(Status.OK, 1.0 + abs(p["BLOCK"] - 320) / 1000)

    job = KeyJob(cache, {"M": 8}, space, feasible, None, 6, measure, lambda p: lambda: None, WallClockTimer(),
                 confirm=1, pool=lambda: pool)  # type: ignore[arg-type,return-value]
    tune_key(job)
    assert len(timed) == 6 and pool.waited == timed
    assert set(timed) <= set(pool.submitted) and len(pool.submitted) == 6  # nothing built past the budget
    assert pool.closed
