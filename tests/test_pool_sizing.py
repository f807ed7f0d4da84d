"""Compile pools of several workers on one host share its cores instead of each taking them all."""

from __future__ import annotations

import os

import pytest

from evotune.measurement import gpu


@pytest.fixture
def host(monkeypatch):
    """A host of 16 cores, 2 GPUs and plenty of free memory, this process free to run on all its cores."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 2**25}[name])
    monkeypatch.setattr(gpu, "host_gpus", lambda: 2)
    return monkeypatch


def test_one_worker_per_gpu_takes_its_share_of_the_cores(host):
    host.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu.workers_on_host() == 2
    two = gpu.default_workers()
    assert two == 16 // 2 - 2
    assert 2 * (two + 2) <= 16  # two workers' pools, tuners and GPU workers fit the host's cores


def test_a_worker_that_sees_every_gpu_is_alone(host):
    host.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu.workers_on_host() == 1 and gpu.default_workers() == 14
    host.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu.default_workers() == 14


def test_a_worker_confined_to_some_cores_takes_those(host):
    host.setenv("CUDA_VISIBLE_DEVICES", "0")
    host.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    assert gpu.default_workers() == 4  # its 6 cores less 2: already its share


def test_memory_is_shared_too(host):
    host.setenv("CUDA_VISIBLE_DEVICES", "0")
    host.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 6 * 2**18}[name])  # 6 GB
    assert gpu.default_workers() == 2  # 3 GB each, 1.5 GB a compile process
