"""Where tuned kernels are kept: one Optuna study per (kernel, key), with the decision in its attributes.

A study is named by what makes a measurement valid, and not by the list of
configurations: ``autotune/KERNEL/SOURCE_HASH/DEVICE/triton-VERSION/build-BUILD/KEY`` (the hash is of
Triton's own ``cache_key`` of the kernel where it has one: the source, the jit functions it
calls, the globals it reads; under the interpreter, of the kernel's source; BUILD is the digest
of the backend, its tools and every codegen knob, :mod:`evotune.triton_tuning.toolchain`)
(:meth:`DecisionStore.study_name`), so a changed list keeps every point measured before, and a changed build
is tuned again. Its
trials are the measured configurations (``python -m evotune best``, ``plot`` and
``dashboard --storage URL`` read them), and its user attribute ``autotune`` holds
the decision: the configuration, its time, which candidates it was chosen from
(a hash of their keys: a changed list is decided again), how, by whom and when.

Location (:func:`cache_url`): the ``cache`` argument (a storage URL, or a folder
that gets ``autotune.db``), else ``$EVOTUNE_AUTOTUNE_CACHE`` (the same), else
``$XDG_CACHE_HOME/evotune/autotune/autotune.db`` (``~/.cache/evotune/autotune/``
when XDG_CACHE_HOME is unset). ``cache=False`` keeps nothing: an in-memory study.

Example::

    decisions = DecisionStore(cache_url(None), KernelId.of(fn))
    store = decisions.study({"M": 64, "a.dtype": "float32"}, space)
    decisions.decision(store)
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import inspect
import json
import marshal
import os
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

from evotune.core.space import SearchSpace
from evotune.storage.study import StudyStore, make_storage
from evotune.storage.summaries import finished_trials
from evotune.storage.trial_writer import checkpoint
from evotune.triton_tuning.toolchain import Toolchain

ENV = "EVOTUNE_AUTOTUNE_CACHE"
PREFIX = "autotune"
DECISION = "autotune"  # the study attribute holding the decision
#: the finished trials of decided studies, by (storage URL, study name, the decision's maker, date and candidates)
_DECIDED: dict[tuple[str, ...], tuple[optuna.trial.FrozenTrial, ...]] = {}


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "evotune" / "autotune"


#: where decisions are kept, as ``evotune.autotune(cache=...)`` takes it: a storage URL or a folder; True or None:
#: the default place; False: nowhere
CacheArg = str | os.PathLike[str] | bool | None


def cache_url(cache: CacheArg) -> str | None:
    """The storage URL of the cache (None: nothing kept, ``cache=False``)."""
    if cache is False:
        return None
    if cache is None or cache is True:
        cache = os.environ.get(ENV) or default_dir()
    text = os.fspath(cache)
    if "://" in text or text.startswith("journal:"):
        return text
    path = Path(text).expanduser()
    return f"sqlite:///{(path / 'autotune.db') if path.suffix != '.db' else path}"


def device_name() -> str:
    """The GPU's name as torch reports it; ``cpu-interpreter`` under TRITON_INTERPRET, else ``cpu``."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu-interpreter"
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name())
    except ImportError:
        pass
    return "cpu"


@dataclass(frozen=True)
class KernelId:
    """What a measurement of a kernel is valid for: its source, the Triton version, the device and the build."""

    name: str
    source_hash: str
    triton_version: str
    device: str
    toolchain: Toolchain | None = None  # None: not part of the key (a replayed recording)

    @classmethod
    def of(cls, fn: Any, jit: Any = None, device: str | None = None,
           toolchain: Toolchain | None = None) -> KernelId:
        """The identity of kernel ``fn`` (the Python function); ``jit`` is its ``triton.jit`` object, whose
        ``cache_key`` (Triton's hash of the source, the jit functions it calls, the globals it reads and its
        line) is hashed when it has one. The interpreter's has none: the function's own source is hashed.
        ``toolchain``: the build (default: the current one)."""
        text = getattr(jit, "cache_key", None)
        if not isinstance(text, str):
            try:
                text = textwrap.dedent(inspect.getsource(fn))
            except (OSError, TypeError):  # defined where no source is kept (an interactive session, exec)
                text = marshal.dumps(fn.__code__).hex()
        import triton

        return cls(fn.__name__, hashlib.sha256(text.encode()).hexdigest()[:16], str(triton.__version__),
                   device or device_name(), toolchain or Toolchain.current())

    @property
    def prefix(self) -> str:
        device = self.device.replace("/", "_")
        build = "" if self.toolchain is None else f"build-{self.toolchain.digest}/"
        return f"{PREFIX}/{self.name}/{self.source_hash}/{device}/triton-{self.triton_version}/{build}"


def key_text(key: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in key.items())


def candidates_hash(keys: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]


@dataclass
class Decision:
    """The configuration chosen for one key, as kept in its study."""

    config: dict[str, Any]  # the point, in storage form
    time_ms: float | None
    candidates: str  # candidates_hash of the points it was chosen among
    how: str  # "confirmed", "timed", "single", "nearest KEY"
    by: str  # the process that decided
    date: str
    confirmation: dict[str, Any] | None = None

    @classmethod
    def from_attr(cls, value: Any) -> Decision | None:
        if not isinstance(value, dict) or "config" not in value:
            return None
        return cls(dict(value["config"]), value.get("time_ms"), str(value.get("candidates", "")),
                   str(value.get("how", "")), str(value.get("by", "")), str(value.get("date", "")),
                   value.get("confirmation"))


class DecisionStore:
    """One kernel's decisions, one per key, each in the study of the measurements it was made from, in one
    storage."""

    def __init__(self, url: str | None, kernel: KernelId):
        self.url, self.kernel = url, kernel
        self.storage = make_storage(url) if url else optuna.storages.InMemoryStorage()

    def study_name(self, key: dict[str, Any]) -> str:
        return self.kernel.prefix + key_text(key)

    def study(self, key: dict[str, Any], space: SearchSpace) -> StudyStore:
        """The study of ``key``, created when missing, with the attributes ``best`` and the dashboard show."""
        attrs = {"experiment": f"{PREFIX}/{self.kernel.name}", "problem_key": key_text(key),
                 "problem": {"kind": "triton", "key": key}, "space": space.name, "strategy": "default",
                 "seed": 0, "hardware": self.kernel.device, "oracle": "cpu" if self.kernel.device.startswith("cpu")
                 else "gpu", "kernel": asdict(self.kernel), "key": key}
        return StudyStore.open(self.storage, self.study_name(key), space, attrs)

    def existing(self, key: dict[str, Any], space: SearchSpace) -> StudyStore | None:
        return StudyStore.load(self.storage, self.study_name(key), space)

    def decision(self, store: StudyStore) -> Decision | None:
        """The decision stored for the study, read afresh (another process may have just written it)."""
        return Decision.from_attr(self.storage.get_study_user_attrs(store.study_id).get(DECISION))

    def write_decision(self, store: StudyStore, decision: Decision) -> None:
        """Store the decision, and copy the sqlite log into the database file: the ``.db`` alone then holds the
        key's trials and decision, so a copy of it deploys them, while this process keeps its connections open
        (a process still holding them when it exits leaves its commits in ``autotune.db-wal``). The copy is
        passive: it waits for no other process, and other processes keep reading and writing meanwhile."""
        self.storage.set_study_user_attr(store.study_id, DECISION, json.loads(json.dumps(asdict(decision))))
        checkpoint(self.storage)

    def decided_trials(self, name: str, decision: Decision) -> tuple[optuna.trial.FrozenTrial, ...]:
        """The finished trials (complete and failed) of the decided study ``name``. Every later key's search reads
        them (its transfer sources, the configurations built for its specialisation): they are read from the
        storage once a process and decision, since a key's trials are all in before its decision is written
        (a decision waits for every process timing the key) and a key tuned again is decided anew."""
        ident = (self.url or "", name, decision.by, decision.date, decision.candidates)
        trials = _DECIDED.get(ident) if self.url else None
        if trials is None:
            trials = finished_trials(self.storage, name)
            if self.url:  # an in-memory storage is this object's own: nothing to share
                _DECIDED[ident] = trials
        return trials

    def tuned(self) -> list[tuple[dict[str, Any], str, Decision]]:
        """(key, study name, decision) of every key of this kernel that has a decision."""
        out = []
        for s in self.storage.get_all_studies():  # one query: names and attributes are all this reads
            if not s.study_name.startswith(self.kernel.prefix):
                continue
            d = Decision.from_attr(s.user_attrs.get(DECISION))
            if d is not None and isinstance(s.user_attrs.get("key"), dict):
                out.append((dict(s.user_attrs["key"]), s.study_name, d))
        return out


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
