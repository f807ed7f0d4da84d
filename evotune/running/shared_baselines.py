"""A problem's baselines, timed once per device and shared by every worker of the experiment.

Timing a problem's baselines (the workload's, the space's own and its named
configurations) takes a GPU worker seconds, and every worker of a shared
experiment would time the same ones. The first worker that needs them on its
device times them and keeps them in a system attribute of the problem's first
study (``evotune:baselines:SETUP``, the setup being the device model, the
torch and CUDA versions and the oracle's L2 flush the timings depend on), with the device information
of that worker, who it was (``host:pid``) and when; a worker of the same setup
that finds them takes them as they are. While one worker times them, the
others wait for its result rather than time them too (a claim in the
namespace :func:`baselines_namespace` names; a worker that dies meanwhile lets the next one
time them).

The confirmation stage is apart from this: it times the baselines again,
interleaved with the best configurations, in the worker that confirms.

Example::

    found = shared_baselines(storage, "exp/gemm_int8_tn_16x4096x4096/cute_hopper_gemm/ga/seed0", claims, info,
                             lambda: evaluator.baselines(problem))
    found.baselines, found.measured_by, found.here
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.study import StudyDirection

from evotune.storage.claims import Claims

ATTR = "evotune:baselines:"
# what a baseline's timing depends on, beside the problem: the L2 flush too (a device_info from before it was
# recorded has none, so its baselines are timed again rather than taken as either flush's)
SETUP_KEYS = ("device", "torch", "cuda", "flush")
POLL_S = 0.5  # how often a waiting worker looks for the timings another one is taking


def baselines_namespace(experiment: str) -> str:
    """The claims namespace in which a worker takes the timing of a problem's baselines."""
    return f"{experiment}#baselines"


def setup_of(device_info: dict[str, Any]) -> str:
    """The device model and versions that baselines timed with ``device_info`` hold for."""
    return "|".join(str(device_info.get(k)) for k in SETUP_KEYS)


@dataclass(frozen=True)
class SharedBaselines:
    """A problem's baselines as one worker timed them: its device information, who and when."""

    baselines: dict[str, Any]
    device_info: dict[str, Any]
    measured_by: str  # the worker that timed them (host:pid, as its claims name it)
    date: str
    here: bool = field(default=False, compare=False)  # timed by this process, in this call

    def describe(self) -> str:
        return f"{self.measured_by} on {self.device_info.get('device')} ({self.date})"


def shared_baselines(storage: optuna.storages.BaseStorage, study: str, claims: Claims,
                     device_info: dict[str, Any], measure: Callable[[], dict[str, Any]]) -> SharedBaselines:
    """The baselines kept in ``study`` for the setup of ``device_info``, or, when it holds none, ``measure()``'s,
    timed here and kept there for the other workers. ``claims``: where the timing is taken (its namespace)."""
    setup = setup_of(device_info)
    found = _read(storage, study, setup)
    if found is not None:
        return found
    with claims.holding(f"{study}|{setup}", POLL_S):  # while another worker times them, wait for its result
        found = _read(storage, study, setup)
        if found is not None:
            return found
        made = SharedBaselines(measure(), device_info, claims.owner,
                               _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), here=True)
        if made.baselines:  # none could be timed (the worker crashed): the next worker tries again
            record = {k: v for k, v in asdict(made).items() if k != "here"}
            storage.set_study_system_attr(_study_id(storage, study), ATTR + setup, record)
        return made


def _read(storage: optuna.storages.BaseStorage, study: str, setup: str) -> SharedBaselines | None:
    try:
        attrs = storage.get_study_system_attrs(storage.get_study_id_from_name(study))
    except KeyError:
        return None
    record = attrs.get(ATTR + setup)
    return None if record is None else SharedBaselines(**record)


def _study_id(storage: optuna.storages.BaseStorage, study: str) -> int:
    """The id of ``study``, made when no worker has made it yet."""
    try:
        return storage.get_study_id_from_name(study)
    except KeyError:
        pass
    try:
        return storage.create_new_study([StudyDirection.MINIMIZE], study)
    except optuna.exceptions.DuplicatedStudyError:  # another worker made it meanwhile
        return storage.get_study_id_from_name(study)
