"""Workers on one host share it: their compile pools share its cores and memory, and each measures on cores that
no compile process runs on."""

from __future__ import annotations

import os

import pytest

from evotune.measurement import host as hostmod
from evotune.measurement.host import Placement, plan


@pytest.fixture
def host(monkeypatch):
    """A host of 16 cores, 2 GPUs and plenty of free memory, this process free to run on all its cores."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 2**25}[name])
    monkeypatch.setattr(hostmod, "host_gpus", lambda: 2)
    monkeypatch.setattr(hostmod, "siblings", lambda cpu: {cpu})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None, raising=False)
    monkeypatch.setattr(hostmod, "_placed", None)  # and back to its value after the test
    hostmod.placement.cache_clear()
    yield monkeypatch
    hostmod.placement.cache_clear()


def test_one_worker_per_gpu_takes_its_share_of_the_cores(host):
    host.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert hostmod.workers_on_host() == 2
    place = hostmod.placement()
    assert place == Placement(frozenset({1}), frozenset(range(2, 16)))  # worker 1 measures on the second core
    hostmod.place_measuring()  # as a run does
    two = hostmod.default_workers()
    assert two == 14 // 2  # the pools share the 14 cores nobody measures on
    assert 2 * two + 2 * len(place.measuring) <= 16


def test_a_worker_that_sees_every_gpu_is_alone(host):
    host.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hostmod.place_measuring()
    assert hostmod.workers_on_host() == 1 and hostmod.default_workers() == 15
    hostmod.unplace()
    hostmod.placement.cache_clear()
    host.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert hostmod.placement() == Placement(frozenset({0}), frozenset(range(1, 16)))
    hostmod.place_measuring()
    assert hostmod.default_workers() == 15


def test_a_worker_confined_to_some_cores_takes_those_and_is_not_moved(host):
    host.setenv("CUDA_VISIBLE_DEVICES", "0")
    host.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    hostmod.place_measuring()
    assert hostmod.placement() is None
    assert hostmod.default_workers() == 4  # its 6 cores less 2: already its share


def test_gpus_named_by_uuid_are_not_placed(host):
    host.setenv("CUDA_VISIBLE_DEVICES", "GPU-5f0e7b0e-0000")
    assert hostmod.gpu_index() is None and hostmod.placement() is None


def test_memory_is_shared_too(host):
    host.setenv("CUDA_VISIBLE_DEVICES", "0")
    host.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 6 * 2**18}[name])  # 6 GB
    assert hostmod.default_workers() == 2  # 3 GB each, 1.5 GB a compile process


def test_a_core_is_a_cpu_and_its_hyperthreads():
    """On a host of 8 cores with two hyperthreads each (CPU c and c + 8), each of two workers measures on a core:
    both of its CPUs are kept from the pools."""
    place = plan(range(16), 2, 1, lambda c: {c % 8, c % 8 + 8})
    assert place == Placement(frozenset({1, 9}), frozenset(range(16)) - {0, 1, 8, 9})


@pytest.mark.parametrize(("cpus", "workers", "index", "measuring"), [
    (range(32), 2, 0, {0}),
    (range(8), 2, 1, {1}),  # 4 per worker: still placed
    (range(7), 2, 0, None),  # under 4 per worker: no placement
    (range(32), 2, 2, None),  # an index beyond the host's workers
])
def test_plan(cpus, workers, index, measuring):
    place = plan(cpus, workers, index, lambda c: {c})
    if measuring is None:
        assert place is None
    else:
        assert place is not None and place.measuring == measuring
        assert not place.pool & place.measuring and len(place.pool) == len(cpus) - workers * len(measuring)


def test_a_compile_process_moves_to_the_pool_and_the_tuner_to_its_cores(host):
    """And the tuner goes back where it was at the run's end (a process that goes on is not left on one core)."""
    moved: list[tuple[int, frozenset[int]]] = []
    host.setattr(os, "sched_setaffinity", lambda pid, cpus: moved.append((pid, frozenset(cpus))), raising=False)
    host.setenv("CUDA_VISIBLE_DEVICES", "0")
    hostmod.place_measuring()
    hostmod.place_pool(hostmod.pool_cpus())
    hostmod.place_pool(None)  # no placement: left where it is
    assert moved == [(0, frozenset({0})), (0, frozenset(range(2, 16)))]
    hostmod.unplace()
    assert moved[-1] == (0, frozenset(range(16))) and hostmod.pool_cpus() == frozenset(range(16))
