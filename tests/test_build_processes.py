"""A module-named kernel's proposals built in other processes (evotune/triton_tuning/build_processes.py): a process
makes the key's launch from the kernel's reference and launch function and compiles the configuration; a launch it
cannot make leaves the build to the measurement; the pool's readiness follows its processes. On the CPU (Triton's
interpreter) nothing is compiled, so a build there says "found built"."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from evotune.triton_tuning.build_processes import BUILT, LaunchRef, ProcessBuilds, build, processes, shutdown

pytest.importorskip("triton")
pytest.importorskip("torch")

TESTS = Path(__file__).resolve().parent
ADD_TUNED = f"{TESTS / 'autotune_kernels.py'}:add_tuned"


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def points() -> list[dict[str, object]]:
    from evotune.triton_tuning.references import load_kernel

    kernel, _ = load_kernel(ADD_TUNED)
    return list(kernel.candidates.points)[:3]


def test_a_build_makes_the_keys_launch_from_the_reference_and_compiles_the_configuration() -> None:
    ref = LaunchRef(ADD_TUNED, None, None, "make_add_args", (("n", 48),))
    assert build(ref, points()[0]) is False  # made the launch and built (the interpreter compiles nothing)
    bad = LaunchRef(ADD_TUNED, None, None, "make_add_args", (("n", "many"),))
    assert build(bad, points()[0]) is None  # left to the measurement, which says why


def test_build_processes_one_a_core_less_two_or_as_set(monkeypatch) -> None:
    monkeypatch.delenv("EVOTUNE_COMPILE_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert processes() == 14
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "3")
    assert processes() == 3


@pytest.mark.slow  # starts two processes (torch and Triton imported in each)
def test_the_pool_builds_in_its_processes_and_a_point_is_ready_once_built(monkeypatch) -> None:
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "2")
    ref = LaunchRef(ADD_TUNED, None, None, "make_add_args", (("n", 32),))
    pool = ProcessBuilds(ref, lambda p: str(sorted(p.items())), depth=2)
    try:
        ps = points()
        pool.submit(ps)
        before = BUILT.count
        for p in ps:
            pool.wait(p)
            assert pool.ready(p)
        assert BUILT.count == before  # the interpreter compiles nothing: nothing counted as built elsewhere
        assert pool.ready({"never": "handed over"})
        pool.close()
    finally:
        shutdown()


def test_a_build_still_queued_is_taken_back_and_left_to_the_measurement(monkeypatch) -> None:
    """The first evaluations do not wait for the processes to start: a point whose build no process has begun is
    built by the measurement here."""
    from concurrent.futures import ThreadPoolExecutor

    import evotune.triton_tuning.build_processes as bp

    release = threading.Event()
    began: list[int] = []

    def slow_build(ref: LaunchRef, point: dict[str, int]) -> bool:
        began.append(point["i"])
        release.wait()
        return True

    one = ThreadPoolExecutor(1)
    monkeypatch.setattr(bp, "executor", lambda ref: one)
    monkeypatch.setattr(bp, "build", slow_build)
    pool = ProcessBuilds(LaunchRef(ADD_TUNED, None, None, "make_add_args", (("n", 32),)), lambda p: str(p["i"]), 1)
    pool.submit([{"i": 0}, {"i": 1}])
    while not began:  # the single worker has taken the first build
        threading.Event().wait(0.01)
    before = BUILT.count
    pool.wait({"i": 1})  # queued behind it: taken back at once, not waited for
    assert began == [0] and pool.ready({"i": 1}) and not pool.ready({"i": 0})
    release.set()
    pool.wait({"i": 0})  # begun: waited for, and counted as built elsewhere
    assert pool.ready({"i": 0}) and BUILT.count == before + 1 and began == [0]
    one.shutdown()


def test_at_most_sixteen_build_processes_unless_set(monkeypatch) -> None:
    monkeypatch.delenv("EVOTUNE_COMPILE_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 128)
    assert processes() == 16
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "40")
    assert processes() == 40
