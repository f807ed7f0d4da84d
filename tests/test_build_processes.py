"""A module-named kernel's proposals built in other processes (evotune/triton_tuning/build_processes.py): a process
makes the key's launch from the kernel's reference and launch function and compiles the configuration; a launch it
cannot make leaves the build to the measurement; the pool's readiness follows its processes. On the CPU (Triton's
interpreter) nothing is compiled, so a build there says "found built"."""

from __future__ import annotations

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
