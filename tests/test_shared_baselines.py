"""A problem's baselines are timed by one worker per device setup and taken from the study by the others."""

from __future__ import annotations

import threading

from optuna.study import StudyDirection

from evotune.running.shared_baselines import ATTR, baselines_namespace, setup_of, shared_baselines
from evotune.storage.claims import Claim, make_claims
from evotune.storage.study import make_storage

STUDY = "e/gemm_int8_tn_16x4096x4096/cute_hopper_gemm/ga/seed0"
H100 = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.9.0", "cuda": "12.8", "copy_gbps": 1500.0}
H200 = {**H100, "device": "NVIDIA H200"}


class Timer:
    """Stands for a worker's evaluator: counts how often it times the baselines."""

    def __init__(self, ms: float):
        self.ms, self.calls = ms, 0

    def __call__(self) -> dict:
        self.calls += 1
        return {"torch._int_mm": {"time_ms": self.ms}}


def claims(url: str, worker: str):
    return make_claims(url, baselines_namespace("e"), owner=f"{worker}:1")


def test_a_second_worker_takes_the_first_ones_baselines(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = make_storage(url)
    first, second, other = Timer(0.010), Timer(0.011), Timer(0.012)
    mine = shared_baselines(storage, STUDY, claims(url, "host-a"), H100, first)
    assert mine.here and mine.measured_by == "host-a:1" and first.calls == 1
    theirs = shared_baselines(storage, STUDY, claims(url, "host-b"), {**H100, "copy_gbps": 1490.0}, second)
    assert second.calls == 0 and not theirs.here
    assert theirs.baselines == {"torch._int_mm": {"time_ms": 0.010}} and theirs.measured_by == "host-a:1"
    assert theirs.device_info == H100  # the device information of the worker that timed them
    elsewhere = shared_baselines(storage, STUDY, claims(url, "host-c"), H200, other)  # another device model
    assert other.calls == 1 and elsewhere.baselines == {"torch._int_mm": {"time_ms": 0.012}}
    study_id = storage.get_study_id_from_name(STUDY)
    assert set(storage.get_study_system_attrs(study_id)) == {ATTR + setup_of(H100), ATTR + setup_of(H200)}


def test_a_worker_waits_for_the_one_timing_them(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = make_storage(url)
    timing = claims(url, "host-a")
    assert timing.claim(f"{STUDY}|{setup_of(H100)}") is Claim.NEW  # host-a is timing them
    waiting, got = Timer(0.5), {}
    worker = threading.Thread(target=lambda: got.update(found=shared_baselines(
        storage, STUDY, claims(url, "host-b"), H100, waiting)))
    worker.start()
    record = {"baselines": {"torch._int_mm": {"time_ms": 0.010}}, "device_info": H100, "measured_by": "host-a:1",
              "date": "2026-11-24T00:00:00+00:00"}
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], STUDY)
    storage.set_study_system_attr(study_id, ATTR + setup_of(H100), record)
    timing.release(f"{STUDY}|{setup_of(H100)}")
    worker.join()
    assert waiting.calls == 0 and got["found"].measured_by == "host-a:1"


def test_baselines_that_could_not_be_timed_are_not_kept(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = make_storage(url)
    crashed = shared_baselines(storage, STUDY, claims(url, "host-a"), H100, lambda: {})
    assert crashed.baselines == {} and crashed.here
    again = Timer(0.010)
    assert shared_baselines(storage, STUDY, claims(url, "host-b"), H100, again).here and again.calls == 1


def test_baselines_timed_after_another_flush_are_timed_again(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = make_storage(url)
    dirty, clean = Timer(0.012), Timer(0.010)
    shared_baselines(storage, STUDY, claims(url, "host-a"), {**H100, "flush": "dirty"}, dirty)
    found = shared_baselines(storage, STUDY, claims(url, "host-b"), {**H100, "flush": "clean"}, clean)
    assert clean.calls == 1 and found.here and found.baselines == {"torch._int_mm": {"time_ms": 0.010}}
