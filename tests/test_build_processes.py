"""A module-named kernel's proposals built in other processes (evotune/triton_tuning/build_processes.py): a process
makes the key's launch from the kernel's reference and launch function and compiles the configuration; a launch it
cannot make leaves the build to the measurement; the pool's readiness follows its processes. On the CPU (Triton's
interpreter) nothing is compiled, so a build there says "found built"."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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


@pytest.mark.parametrize(("cores", "default", "set_to"), [(16, 14, 3), (128, 16, 40)])
def test_build_processes_one_a_core_less_two_at_most_sixteen_or_as_set(monkeypatch, cores, default, set_to) -> None:
    monkeypatch.delenv("EVOTUNE_COMPILE_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    assert processes() == default
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", str(set_to))
    assert processes() == set_to


@pytest.mark.slow  # starts two processes (torch and Triton imported in each)
def test_the_pool_builds_in_its_processes_and_a_point_is_ready_once_built(monkeypatch) -> None:
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "2")
    import evotune.triton_tuning.build_processes as bp

    ref = LaunchRef(ADD_TUNED, None, None, "make_add_args", (("n", 32),))
    pool = ProcessBuilds(ref, lambda p: str(sorted(p.items())), depth=2)
    try:
        ps = points()
        pool.submit(ps[:1])  # the processes are still being started (by a thread): the measurement's to build
        assert pool.ready(ps[0]) and not pool._futures
        while bp.executor(ref) is None:  # up once that thread has started every process
            threading.Event().wait(0.05)
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


def one_thread_pool(monkeypatch: pytest.MonkeyPatch, build: Callable[..., bool], threads: int = 1) -> tuple[
        ThreadPoolExecutor, ProcessBuilds]:
    """A ProcessBuilds whose builds run ``build`` on ``threads`` threads of this process (one: in the order handed
    over), as deep as it has threads."""
    import evotune.triton_tuning.build_processes as bp

    one = ThreadPoolExecutor(threads)
    monkeypatch.setattr(bp, "executor", lambda ref: one)
    monkeypatch.setattr(bp, "build", build)
    return one, ProcessBuilds(LaunchRef(ADD_TUNED, None, None, "make_add_args", (("n", 32),)), lambda p: str(p["i"]),
                              threads)


def gated_builds(n: int) -> tuple[dict[int, threading.Event], list[int], Callable[..., bool]]:
    """A build of point ``i`` (< ``n``) that records ``i`` as begun, then waits for gate ``i``: (gates, begun,
    build)."""
    gates = {i: threading.Event() for i in range(n)}
    began: list[int] = []

    def build(ref: LaunchRef, point: dict[str, int], gpu: object = None) -> bool:
        began.append(point["i"])
        gates[point["i"]].wait()
        return True

    return gates, began, build


def test_the_first_evaluations_do_not_wait_for_the_processes_to_start(monkeypatch) -> None:
    """A point whose build no process has begun (queued behind others), or begun before any process has returned a
    build (the pool marks its first builds running while its processes still start), is built by the measurement
    here; once a process has returned a build, a begun build is waited for and counted as built elsewhere."""
    import evotune.triton_tuning.build_processes as bp

    gates, began, slow_build = gated_builds(3)
    one, pool = one_thread_pool(monkeypatch, slow_build)
    try:
        pool.submit([{"i": 0}, {"i": 1}, {"i": 2}])
        while not began:  # the single worker has taken the first build
            threading.Event().wait(0.01)
        before = BUILT.count
        pool.wait({"i": 1})  # queued behind it: taken back at once, not waited for
        pool.wait({"i": 0})  # begun, but no build has come back yet: left to the measurement, not waited for
        assert began == [0] and not gates[0].is_set() and BUILT.count == before
        gates[0].set()  # the first build comes back; the worker takes the third (the second was taken back)
        while len(began) < 2:
            threading.Event().wait(0.01)
        assert began == [0, 2]
        threading.Thread(target=gates[2].set).start()
        pool.wait({"i": 2})  # begun once the processes are up: waited for, and counted as built elsewhere
        assert pool.ready({"i": 2}) and BUILT.count == before + 1
    finally:
        for gate in gates.values():
            gate.set()
        one.shutdown()
        bp._warm.clear()


def test_a_pool_started_ahead_loads_the_kernel_and_none_is_started_under_the_interpreter() -> None:
    import evotune.triton_tuning.build_processes as bp

    bp._kernels.clear()
    bp.prepare(ADD_TUNED, None, None)  # what each process does first: the module's imports, its kernel
    assert (ADD_TUNED, None, None) in bp._kernels
    bp.prepare(f"{TESTS / 'no_such_module.py'}:k", None, None)  # a failure is left to the first build
    bp.start(ADD_TUNED)  # the interpreter builds nothing ahead: no processes
    assert (ADD_TUNED, None, None) not in bp._executors


def test_a_launch_signature_holds_tensors_as_dtypes_and_is_refused_where_it_would_build_otherwise() -> None:
    import torch

    from evotune.triton_tuning.build_processes import signature

    x = torch.zeros(64, dtype=torch.bfloat16)
    assert signature((x, 64, 1.5, None), {"top_k": 2, "FP8": False}) == (
        (torch.bfloat16, 64, 1.5, None), (("top_k", 2), ("FP8", False)))
    assert signature((x[1:], 64), {}) is None  # 2 bytes in: not 16-byte aligned, a build of its own
    assert signature((x,), {"scale": x}) is None  # a tensor by keyword: Triton's warmup takes no dtype there
    assert signature(((1, 2),), {}) is None  # a value of another kind


def test_a_build_from_the_signature_needs_no_launch_function() -> None:
    from evotune.triton_tuning.build_processes import signature
    from evotune.triton_tuning.references import load_module

    args = load_module(ADD_TUNED.rpartition(":")[0]).make_add_args(48)[1]
    sig = signature(tuple(args), {})
    assert sig is not None
    ref = LaunchRef(ADD_TUNED, None, None, "no_such_function", (("n", 48),), sig)
    assert build(ref, points()[0]) is False  # built from the signature (the interpreter compiles nothing)


def test_a_broken_pool_is_replaced_and_a_submit_to_one_leaves_the_builds_to_the_measurement(monkeypatch) -> None:
    from concurrent.futures.process import BrokenProcessPool

    import evotune.triton_tuning.build_processes as bp

    class Broken:
        _broken = "a process died"

        def submit(self, *args, **kwargs):
            raise BrokenProcessPool(self._broken)

    name = (ADD_TUNED, None, "n")
    monkeypatch.setitem(bp._executors, name, Broken())
    pool = ProcessBuilds(LaunchRef(ADD_TUNED, None, "n", "make_add_args", (("n", 32),)), lambda p: str(p), 1)
    try:
        assert not isinstance(pool._pool, Broken)  # a new pool, not the broken one
        bp._executors[name] = pool._pool = Broken()  # it breaks while the key is tuned
        pool.submit([{"i": 0}])  # nothing raised: the point is the measurement's to build
        assert pool.ready({"i": 0})
    finally:
        bp._executors.pop(name, None)
        shutdown()  # the new pool's processes


def test_speculation_drops_the_queued_builds_no_longer_wanted_and_keeps_the_rest(monkeypatch) -> None:
    """The search's ranking moves on after each result: builds still queued for points it no longer ranks ahead are
    taken back, those it still wants keep their place, a running one finishes."""
    import evotune.triton_tuning.build_processes as bp

    gate, began = threading.Event(), []

    def build(ref: LaunchRef, point: dict[str, int], gpu: object = None) -> bool:
        began.append(point["i"])
        gate.wait()
        return True

    one, pool = one_thread_pool(monkeypatch, build)
    try:
        assert pool.speculates
        pool.speculate([{"i": 0}, {"i": 1}, {"i": 2}])
        while not began:
            threading.Event().wait(0.01)
        pool.speculate([{"i": 3}, {"i": 2}])  # 0 runs on; 1 is no longer wanted; 2 keeps its place before 3
        gate.set()
        one.shutdown(wait=True)  # every build queued is run
        assert began == [0, 2, 3] and pool.ready({"i": 1})
    finally:
        gate.set()
        one.shutdown()
        bp._warm.clear()


def test_a_loaded_kernels_oracle_is_made_on_first_use_not_when_a_build_process_loads_it(monkeypatch) -> None:
    """Loading a kernel (what each build process does) makes its timer; the oracle inside makes a CUDA context and
    a flush buffer on the GPU, beside the timing process: only a timing makes it."""
    import evotune.measurement.oracle as oracle
    from evotune.triton_tuning.timers import OracleTimer

    made: list[tuple[object, ...]] = []
    monkeypatch.setattr(oracle, "Oracle", lambda *args, **kwargs: made.append(args) or "the oracle")
    timer = OracleTimer(5, 50.0)
    assert made == []
    assert timer.oracle == "the oracle" and timer.oracle == "the oracle" and len(made) == 1


class _DriverTouchingCuda:
    """A stand-in for Triton's CUDA driver: every answer it would give itself goes through CUDA."""

    touched: list[str] = []

    def get_current_device(self) -> int:
        self.touched.append("device")
        return 3

    def get_current_stream(self, device: int | None = None) -> int:
        self.touched.append("stream")
        return 7

    def get_device_capability(self, device: int | None = None) -> tuple[int, int]:
        self.touched.append("capability")
        return (8, 0)

    def get_current_target(self) -> object:
        self.touched.append("target")
        return None


@pytest.mark.slow  # a fresh interpreter (torch and Triton imported) starts two processes
def test_processes_started_before_cuda_and_threads_are_forked_from_this_process_and_build(tmp_path) -> None:
    import os
    import subprocess
    import sys

    script = f"""
import os, threading
import evotune.triton_tuning.build_processes as bp
from evotune.triton_tuning.compile_ahead import CompilePool
CompilePool.available = classmethod(lambda cls: True)  # the interpreter builds nothing ahead otherwise
assert bp.fork_safe()
bp.start({ADD_TUNED!r})
ref = bp.LaunchRef({ADD_TUNED!r}, None, None, "make_add_args", (("n", 32),))
pool = bp.executor(ref)
assert pool is not None  # up at once: no server to wait for
assert set(pool.submit(os.getppid).result() for _ in range(4)) == {{os.getpid()}}
builds = bp.ProcessBuilds(ref, lambda p: str(sorted(p.items())), depth=2)
from evotune.triton_tuning.references import load_kernel
points = list(load_kernel({ADD_TUNED!r})[0].candidates.points)[:3]
builds.submit(points)
for p in points:
    builds.wait(p)
    assert builds.ready(p)
builds.close()
gate = threading.Event()
threading.Thread(target=gate.wait).start()
assert not bp.fork_safe()  # another thread: a lock it holds would be copied into the processes
gate.set()
bp.shutdown()
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "EVOTUNE_COMPILE_THREADS": "2",
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    got = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "ok"


def test_a_build_process_compiles_for_its_parents_gpu_without_asking_cuda() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from evotune.triton_tuning.build_processes import compile_only, target

    assert target() is None  # under the interpreter: nothing to pass on, the processes ask Triton themselves
    import evotune.triton_tuning.build_processes as bp

    before = driver._active
    try:
        ref = LaunchRef(ADD_TUNED, None, None, "make_add_args", (("n", 48),))
        bp.build(ref, points()[0], (_DriverTouchingCuda, "cuda", 90, 32))  # the GPU comes with each build
        assert bp._compiling_for == [(_DriverTouchingCuda, "cuda", 90, 32)]
        compile_only((_DriverTouchingCuda, "cuda", 90, 32))
        active = driver.active
        assert isinstance(active, _DriverTouchingCuda)
        assert active.get_current_target() == GPUTarget("cuda", 90, 32)
        assert (active.get_current_device(), active.get_current_stream(0), active.get_device_capability(0)) == \
            (0, 0, (9, 0))
        assert _DriverTouchingCuda.touched == []
    finally:
        driver._active = before
        bp._compiling_for.clear()


def test_later_keys_are_built_only_while_the_searchs_own_builds_leave_processes_idle(monkeypatch) -> None:
    """Background builds (later keys' configurations) start only while none of the search's own is running or
    queued, and never on the last RESERVED processes; one the search proposes meanwhile is waited for as its own
    and counted as its compile; one that ended is told as built ahead (not counted); those not begun are dropped
    when the key ends."""
    import evotune.triton_tuning.build_processes as bp

    gates, began, gated = gated_builds(8)

    def until(condition: Callable[[], bool]) -> None:
        while not condition():
            threading.Event().wait(0.01)

    threads, pool = one_thread_pool(monkeypatch, gated, 4)
    bp._warm.add(threads)  # type: ignore[arg-type]
    assert 4 - bp.RESERVED == 2
    told: list[str] = []
    try:
        pool.submit([{"i": 0}])
        pool.background([{"i": 4}, {"i": 5}, {"i": 6}, {"i": 7}, {"i": 3}], told.append)
        assert not pool._background  # the search's own build is running: nothing in the background
        gates[0].set()
        until(lambda: pool._futures["0"].done())
        assert pool.ready({"i": 0}) and set(pool._background) == {"4", "5"}  # two processes kept free
        until(lambda: sorted(began) == [0, 4, 5])
        count = bp.CompileCount()
        gates[4].set()
        until(lambda: told == ["4"])
        pool.submit([{"i": 5}])  # proposed while building in the background: now the search's own
        gates[5].set()
        pool.wait({"i": 5})
        assert count.elsewhere == 1  # 5, waited for; 4, ended in the background, is a load where it is measured
        pool.ready({"i": 1})
        assert {"6", "7"} <= set(pool._background)
        until(lambda: sorted(began) == [0, 4, 5, 6, 7])
        pool.ready({"i": 1})
        assert "3" not in pool._background  # 6 and 7 hold the two processes background builds may take
        pool.close()  # 3 is dropped; 6 and 7 finish into the cache
    finally:
        for gate in gates.values():
            gate.set()
        threads.shutdown(wait=True)
        bp._warm.discard(threads)  # type: ignore[arg-type]
    assert sorted(told) == ["4", "5", "6", "7"] and sorted(began) == [0, 4, 5, 6, 7]


def test_the_autotuner_builds_ahead_for_later_keys_of_its_specialisation_with_their_constraints(tmp_path,
                                                                                              monkeypatch) -> None:
    """The keys tune-kernel tunes next (Autotuner.upcoming): each one's candidates pruned for its own values, those
    of another specialisation (n = 24: neither 1 nor a multiple of 16) left out, the new tile sizes first."""
    import torch

    import evotune
    import evotune.triton_tuning.autotuner as autotuner
    from evotune.core.space import SearchSpace, constraint, ordinal
    from evotune.triton_tuning.configs import LaunchContext
    from tests.autotune_kernels import add, make_add_args

    space = SearchSpace("add_within_n", [ordinal("BLOCK", [16, 32, 64]), ordinal("num_warps", [1, 2]),
                                         ordinal("num_stages", [1])],
                        constraints=[constraint("block-within-n", lambda p, ctx: p["BLOCK"] <= ctx.args["n"],
                                                "BLOCK {BLOCK} is larger than n")])
    kernel = evotune.autotune(space=space, key=["n"], cache=f"sqlite:///{tmp_path}/at.db")(add)
    _, args = make_add_args(16)
    kernel.nargs = dict(zip(kernel.arg_names, args, strict=False))
    fields = kernel.key_fields(kernel.nargs, {})
    kernel.upcoming = [{**fields, "n": n} for n in (24, 32, 64)]
    asked: list[int] = []
    original = autotuner.later_points

    def later_points(space, current, later, built):
        asked.extend(len(fs) for fs in later)
        return original(space, current, later, built)

    monkeypatch.setattr(autotuner, "later_points", later_points)
    now = kernel.candidates.feasible(LaunchContext(args=dict(kernel.nargs)))
    got = [(p["BLOCK"], p["num_warps"]) for p in kernel._later({}, kernel.candidates, now, fields,
                                                                      kernel._built(fields, kernel.candidates.space))]
    assert asked == [4, 6]  # n = 32 keeps BLOCK 16 and 32, n = 64 all three; n = 24 is not asked for
    assert sorted(got[:2]) == [(32, 1), (32, 2)] and sorted(got[2:4]) == [(64, 1), (64, 2)]
    assert sorted(got[4:]) == [(16, 1), (16, 2)]  # offered by this key too: after the new tiles
    assert torch.equal(args[0], kernel.nargs["x"])  # the launch itself untouched
