"""The on-disk kernel cache: a kernel is compiled once per cache, whichever process needs it first."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from evotune.measurement.kernel_cache import KernelCache

KEY = "k" * 24
TIMEOUT = 600  # seconds any step may wait for another process; only a broken test waits that long


def _build_into(cache: KernelCache, key: str) -> None:
    (cache.root / f"{key}.bin").write_text(f"built by {os.getpid()}")
    cache.add(key, "a kernel", 0.0)


def _first(root: str, holding, go) -> None:
    """Claims the key and compiles it, but only once the second process is waiting for it."""
    cache = KernelCache(Path(root))

    def build() -> None:
        holding.set()
        assert go.wait(TIMEOUT)
        _build_into(cache, KEY)

    assert cache.build_once(KEY, build) is False


def _second(root: str, checked, result) -> None:
    """Needs the same kernel while the first process compiles it."""
    cache = KernelCache(Path(root))
    looks = []

    def present() -> bool:
        looks.append(1)
        if len(looks) == 1:
            checked.set()  # it has looked, found nothing, and goes for the key now
        return cache.has(KEY)

    result.put(cache.build_once(KEY, lambda: _build_into(cache, KEY), present))


def test_two_processes_needing_one_kernel_compile_it_once(tmp_path):
    ctx = mp.get_context("fork")
    holding, checked, go, result = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    first = ctx.Process(target=_first, args=(str(tmp_path), holding, go))
    first.start()
    assert holding.wait(TIMEOUT)  # the first process is compiling
    second = ctx.Process(target=_second, args=(str(tmp_path), checked, result))
    second.start()
    assert checked.wait(TIMEOUT)  # the second found no kernel and wants it too
    go.set()  # the first finishes its compile
    first.join(TIMEOUT)
    second.join(TIMEOUT)
    assert first.exitcode == 0 and second.exitcode == 0
    assert result.get(timeout=TIMEOUT) is True  # the second took the first one's kernel: a hit
    cache = KernelCache(tmp_path)
    builds = cache.builds()
    assert [b["key"] for b in builds] == [KEY] and builds[0]["pid"] == first.pid
    assert (tmp_path / f"{KEY}.bin").read_text() == f"built by {first.pid}"


def test_a_compile_that_died_holds_nobody_up(tmp_path):
    """The lock of a process killed while compiling goes with it: the next process compiles the kernel."""
    ctx = mp.get_context("fork")

    def die_compiling() -> None:
        cache = KernelCache(tmp_path)
        cache.build_once(KEY, lambda: os._exit(9))

    proc = ctx.Process(target=die_compiling)
    proc.start()
    proc.join(TIMEOUT)
    assert proc.exitcode == 9
    cache = KernelCache(tmp_path)
    assert cache.build_once(KEY, lambda: _build_into(cache, KEY)) is False
    assert cache.build_once(KEY, lambda: _build_into(cache, KEY)) is True
    assert [b["pid"] for b in cache.builds()] == [os.getpid()]


def _hold_until(root: str, holding, go) -> None:
    """Claims the key as a compile does, and holds it until told."""
    cache = KernelCache(Path(root))
    with cache.claimed(KEY):
        holding.set()
        assert go.wait(TIMEOUT)
    _build_into(cache, KEY)


def _never_waiting(root: str, result) -> None:
    """A compile process: it does not wait for the key another process compiles."""
    from evotune.measurement import kernel_cache

    kernel_cache.never_wait()
    cache = KernelCache(Path(root))
    try:
        cache.build_once(KEY, lambda: _build_into(cache, KEY))
        result.put("built")
    except kernel_cache.BuiltElsewhere as exc:
        result.put(str(exc.lock))


def test_a_compile_process_moves_on_from_a_kernel_another_process_compiles(tmp_path):
    """It says where the other compile's lock is, and `building` says when that compile is done."""
    from evotune.measurement.kernel_cache import building

    ctx = mp.get_context("fork")
    holding, go, result = ctx.Event(), ctx.Event(), ctx.Queue()
    first = ctx.Process(target=_hold_until, args=(str(tmp_path), holding, go))
    first.start()
    assert holding.wait(TIMEOUT)
    second = ctx.Process(target=_never_waiting, args=(str(tmp_path), result))
    second.start()
    second.join(TIMEOUT)
    lock = result.get(timeout=TIMEOUT)
    assert lock.endswith(f"{KEY}.lock") and building(lock)
    go.set()
    first.join(TIMEOUT)
    assert not building(lock) and KernelCache(tmp_path).has(KEY)
    assert not building(tmp_path / "no such.lock")


def _waiting(root: str, result) -> None:
    """Needs the kernel another process is compiling, and waits for it: says what it found and how long it waited."""
    from evotune.measurement import kernel_cache

    cache = KernelCache(Path(root))
    before = kernel_cache.waited_s()
    hit = cache.build_once(KEY, lambda: _build_into(cache, KEY))
    result.put((hit, kernel_cache.waited_s() - before))


def _blocked_on(lock: Path) -> bool:
    """Whether a process waits for ``lock``'s flock: /proc/locks lists a blocked request after ``->``."""
    inode = lock.stat().st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[1] == "->" and fields[2] == "FLOCK" and fields[6].endswith(f":{inode}"):
            return True
    return False


def test_a_process_counts_its_wait_for_another_ones_compile(tmp_path):
    """The GPU worker reports that wait apart from its time on the point (kernel_cache.waited_s): a compile wait,
    which a worker beside others on a host meets when they need one kernel at once."""
    from evotune.measurement import kernel_cache

    ctx = mp.get_context("fork")
    holding, go, result = ctx.Event(), ctx.Event(), ctx.Queue()
    first = ctx.Process(target=_first, args=(str(tmp_path), holding, go))
    first.start()
    assert holding.wait(TIMEOUT)  # the first process is compiling the kernel, holding its lock
    second = ctx.Process(target=_waiting, args=(str(tmp_path), result))
    second.start()
    lock, guard = tmp_path / "locks" / f"{KEY}.lock", time.monotonic() + TIMEOUT
    while not _blocked_on(lock):  # until the second process is blocked on the lock
        assert time.monotonic() < guard, "the second process never waited for the lock"
        time.sleep(0.01)
    time.sleep(0.2)
    go.set()
    hit, waited = result.get(timeout=TIMEOUT)
    first.join(TIMEOUT)
    second.join(TIMEOUT)
    assert hit is True and waited >= 0.2  # it took the first one's kernel, after waiting at least the 0.2 s
    before = kernel_cache.waited_s()
    cache = KernelCache(tmp_path)
    assert cache.build_once("u" * 24, lambda: _build_into(cache, "u" * 24)) is False
    assert kernel_cache.waited_s() == before  # nobody held that one: no wait


def test_the_gpu_evaluator_counts_the_gpu_workers_wait_for_another_compile_as_a_compile_wait():
    """A trial's ``worker_s`` and ``served_s`` are the GPU worker's work on the point; its wait for another
    process's compile of the kernel is ``waited_s``, which the tuner's costs count with the compile waits."""
    from evotune.core.plugins import load_space
    from evotune.core.problem import Problem
    from evotune.measurement import gpu
    from evotune.measurement.messages import Reply, ReplyStatus

    ev = object.__new__(gpu.GpuEvaluator)  # its state only: no GPU worker is started
    ev.space = load_space(str(Path(__file__).resolve().parent / "spaces" / "faults.py"))
    ev.timeout_s, ev.workers, ev._compiling, ev._seed, ev.cache_stats = 300.0, 0, {}, 0, {}
    ev.bound(None)

    class Worker:
        def call(self, message, timeout_s=None):
            time.sleep(0.5)  # 0.4 s of it waiting for another process's compile
            return Reply(ReplyStatus.OK, time_ms=1.0, samples_ms=[1.0], extra={"waited_s": 0.4}, served_s=0.5)

    ev._worker = Worker()
    started = time.perf_counter()
    result = ev.evaluate({"mode": "ok_fast", "size": 1}, Problem.gemm(64, 64, 64, "fp32"))
    spent = time.perf_counter() - started
    assert result.extra["waited_s"] == 0.4
    assert result.extra["served_s"] == pytest.approx(0.1)
    assert 0.1 <= result.extra["worker_s"] <= spent - 0.4


def test_an_index_that_is_no_json_object_reads_as_empty(tmp_path):
    cache = KernelCache(tmp_path)
    cache.index_path.write_text(f'["{KEY}"]')  # JSON, but not an index: as unreadable as a cut-short one
    assert not cache.has(KEY)
    cache.add(KEY, "a kernel", 0.0)
    assert cache.has(KEY)
