"""What tuning one key leaves: :class:`Outcome`, and the :class:`KeyTuner` that makes it; when a worker started
and began its first evaluation (:class:`WorkerStart`).

The run (``runner.py``) deals keys to workers and records each key's outcome; how a key is tuned is the tuner's:
evotune's autotune on the GPU (``tuning.py``), or any object with the same ``tune`` method (a stand-in that runs
on the CPU, named with ``--tuner MODULE:FUNCTION``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from evotune.model.plan import Key


@dataclass(frozen=True)
class Outcome:
    """One key, decided: the configuration, its time and the untuned baseline's, and what it cost."""

    key: str  # Key.ident
    kernel: str  # Shape.name
    family: str  # Family.value
    fields: dict[str, int]  # M, N, K (and E, top_k)
    config: dict[str, Any]  # the chosen configuration, under the kernel's parameter names (as a study stores it)
    evaluations: int  # configurations measured for the key, by any process, ever
    new: int  # of those, by this run
    gpu_s: float  # seconds the key held its GPU in this run
    time_ms: float | None  # the chosen configuration's time (None: a single configuration, not timed)
    untuned_ms: float | None  # the untuned default's (vLLM's default configuration, or cuBLAS); None: not timed
    how: str  # how it was decided ("confirmed", "timed", ...)
    device: str  # torch.cuda.get_device_name(), or what the tuner runs on
    triton_version: str
    space: str = ""  # the search space the tuner searched (its name), for the tuning-result cache
    compiles: int | None = None  # configurations compiled while the key was searched (None: not counted)
    loads: int | None = None  # configurations found built (by an earlier key, any worker) in the on-disk cache
    #: of ``gpu_s``, the GPU's seconds on timing (the new evaluations and the confirmation; None: not counted)
    timing_s: float | None = None

    @property
    def ratio(self) -> float | None:
        """untuned / tuned time (above 1: the tuned configuration is faster), where both were measured."""
        if self.time_ms is None or self.untuned_ms is None or self.time_ms <= 0:
            return None
        return self.untuned_ms / self.time_ms

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Outcome:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


@dataclass(frozen=True)
class WorkerStart:
    """When a worker's process started and when it began its first evaluation (epoch seconds), and its pid."""

    started: float
    first_evaluation: float
    pid: int

    @property
    def startup_s(self) -> float:
        """Seconds from the worker's start to its first evaluation."""
        return self.first_evaluation - self.started

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> WorkerStart:
        return cls(float(doc["started"]), float(doc["first_evaluation"]), int(doc["pid"]))


class KeyTuner(Protocol):
    def tune(self, key: Key) -> Outcome:
        """Tune ``key`` (resuming what an interrupted run of it measured) and say what was decided."""
        ...
