"""Decode keys (M <= 64) tuned with the ``triton_decode_gemm`` family, in evotune's one tuning loop.

A decode GEMM ``y = x W^T`` (layout ``tn``: the layer's K-contiguous weight) is a problem of the
``triton_decode_gemm`` space (split-K over the weight stream; bf16, int8, fp8), tuned as ``python -m evotune run``
tunes a problem: one study per key (:func:`evotune.running.tuner.tune_study`) measured by the GPU evaluator (the
compile pool and the GPU worker process: build, verify, time with the oracle), searched by the ``default`` strategy
with the run's other decode keys on this GPU as its transfer sources, then the fastest configurations re-timed
beside cuBLAS in the confirmation stage (:func:`evotune.running.confirmation.confirm_best`: interleaved rounds, in
one process). The confirmed fastest configuration is the decision, and the ratio is cuBLAS's confirmed time over
it.

The studies live in the run's ``OUT/autotune.db`` (one per key, named by the run, the problem and the device), so
an interrupted key resumes from its trials and nothing is timed twice; each point is claimed before it is measured
(:mod:`evotune.storage.claims`). The decision goes to ``tune.json`` through the run's outcome
(:func:`evotune.model.exports.write_tuned`), where ``lookup(Problem.gemm(M, N, K, dtype, "tn"),
space="triton_decode_gemm")`` finds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from evotune.core.budget import Budget
from evotune.core.hardware import Hardware, detect
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.space import Context, Point, SearchSpace
from evotune.measurement.base import Evaluator
from evotune.measurement.options import ConfirmOptions, OracleOptions
from evotune.model.outcome import Outcome
from evotune.model.plan import DEFAULT_BUDGET, Family, Key
from evotune.model.runner import autotune_cache
from evotune.running.confirmation import ConfirmationRecord, confirm_best
from evotune.running.tuner import tune_study
from evotune.search.strategies import make_strategy
from evotune.search.transfer import from_studies
from evotune.storage.claims import make_claims
from evotune.storage.study import StudyStore, make_storage

SPACE_NAME = Family.DECODE.value
LAYOUT = "tn"  # the layer's weight, K-contiguous: what the decode kernel streams
STRATEGY = "default"
#: the confirmation stage of one key: the fastest few re-timed beside cuBLAS, a few seconds of rounds (a key's
#: search is 64 evaluations: the stage stays a small part of it)
CONFIRM = ConfirmOptions(top_k=3, screen_max=8, max_rounds=30, max_seconds=6.0, warmup_s=0.5)
CLAIM_LEASE_S = 900.0  # a claim outlives any honest evaluation (the oracle's timeout is 300 s); a dead worker's
#                        lapses at once

EvaluatorFactory = Callable[[SearchSpace], Evaluator]


def gpu_evaluator(space: SearchSpace) -> Evaluator:
    """The GPU evaluator ``run`` uses (compile pool, GPU worker, oracle, baselines, confirmation rounds)."""
    from evotune.measurement.gpu import GpuEvaluator

    return GpuEvaluator(space, OracleOptions(confirm=CONFIRM))


@dataclass(frozen=True)
class Decided:
    """A key's decision: the configuration, its confirmed time, the baseline's, and how it was decided."""

    point: Point
    time_ms: float | None
    untuned_ms: float | None
    how: str  # "confirmed" (re-timed beside cuBLAS) or "searched" (the search's time; no confirmation record)


def decide(measured: list[tuple[float, Point]], record: ConfirmationRecord | None,
           key_of: Callable[[Point], str]) -> Decided:
    """The fastest configuration by the confirmation ``record`` (its items keyed by point key and by baseline
    name), or by the search's times where there is none; the baseline's confirmed median beside it."""
    by_key = {key_of(p): p for _, p in measured}
    items = record.timed.get("items", {}) if record is not None else {}
    confirmed = {k: float(v["median_ms"]) for k, v in items.items() if k in by_key}
    baselines = [float(v["median_ms"]) for k, v in items.items() if k not in by_key]
    if confirmed:
        best = min(confirmed, key=lambda k: confirmed[k])
        return Decided(by_key[best], confirmed[best], min(baselines, default=None), "confirmed")
    value, point = min(measured, key=lambda t: t[0])
    return Decided(point, value, None, "searched")


def _compiled(before: dict[str, int], after: Mapping[str, int]) -> tuple[int | None, int | None]:
    """(compiles, loads) of the kernel cache between two of its counts; (None, None) where it counts nothing."""
    if not after:
        return None, None
    return (after.get("miss", 0) - before.get("miss", 0),
            after.get("hit", 0) - before.get("hit", 0))


class DecodeTuner:
    """Tunes decode keys of a plan into the run's ``OUT/autotune.db``, ``budget`` evaluations a key.

    ``evaluator``: makes the evaluator (the GPU's by default; the tests give a stand-in); ``hardware``: the GPU the
    space's limits are read for (detected on first use by default)."""

    def __init__(self, out: Path, dtype: str, run: str, budget: int = DEFAULT_BUDGET,
                 evaluator: EvaluatorFactory = gpu_evaluator, hardware: Hardware | None = None, seed: int = 0):
        self.url = autotune_cache(out)
        self.dtype, self.run, self.budget, self.seed = dtype, run, budget, seed
        self.space = load_space(SPACE_NAME)
        self._make_evaluator = evaluator
        self._evaluator: Evaluator | None = None
        self._hardware = hardware
        self.console = Console(stderr=True)

    @property
    def hardware(self) -> Hardware:
        if self._hardware is None:
            self._hardware = detect()
        return self._hardware

    @property
    def evaluator(self) -> Evaluator:
        if self._evaluator is None:
            self._evaluator = self._make_evaluator(self.space)
        return self._evaluator

    def problem(self, key: Key) -> Problem:
        return Problem.gemm(key.m, key.shape.n, key.shape.k, self.dtype, LAYOUT)

    def study_name(self, problem: Problem) -> str:
        """``RUN/DEVICE/PROBLEM/SPACE/STRATEGY/seedN``: one study per key and device."""
        return f"{self.run}/{self.hardware.name}/{problem.key}/{self.space.name}/{STRATEGY}/seed{self.seed}"

    def tune(self, key: Key) -> Outcome:
        started = time.perf_counter()
        problem = self.problem(key)
        ctx = Context(self.hardware, problem)
        feasible = self.space.feasible(ctx)
        if not len(feasible):
            raise RuntimeError(f"{key.ident}: no configuration of {self.space.name} is feasible on "
                               f"{self.hardware.name}")
        storage = make_storage(self.url)
        name = self.study_name(problem)
        attrs = {"experiment": self.run, "space": self.space.name, "space_source": self.space.name,
                 "problem": problem.to_dict(), "problem_key": problem.key, "strategy": STRATEGY, "seed": self.seed,
                 "oracle": self.evaluator.kind, "hardware": self.hardware.name, "feasible": len(feasible),
                 "space_size": self.space.size}
        store = StudyStore.open(storage, name, self.space, attrs)
        before = len(store.history())
        stats = dict(self.evaluator.cache_stats)  # the kernel cache's hits and misses (compiles) so far
        sources = from_studies(storage, self.space, problem, self.hardware.name, experiment=self.run)
        strategy = make_strategy(STRATEGY, self.space, feasible, seed=self.seed, ctx=ctx, sources=sources)
        tune_study(self.space, ctx, self.evaluator, strategy, store, Budget(trials=min(self.budget, len(feasible))),
                   claims=make_claims(self.url, name, CLAIM_LEASE_S))
        history = store.history()
        measured = [(r.value, r.point) for r in history if r.value is not None]
        if not measured:
            raise RuntimeError(f"{key.ident}: every configuration of {self.space.name} failed "
                               f"({len(history)} tried)")
        record = confirm_best(problem, self.evaluator, measured, self.space.to_storage, self.console, CONFIRM)
        if record is not None:
            store.study.set_user_attr("confirmation", record.to_attr())
        decided = decide(measured, record, self.space.key)
        import triton

        return Outcome(key.ident, key.shape.name, key.shape.family.value, key.fields(),
                       dict(self.space.to_storage(decided.point)), len(history), len(history) - before,
                       time.perf_counter() - started, decided.time_ms, decided.untuned_ms, decided.how,
                       # a time not measured on the GPU is never kept as the GPU's (tuned.json's oracle)
                       self.hardware.name if self.evaluator.kind == "gpu" else f"cpu-{self.evaluator.kind}",
                       str(triton.__version__), self.space.name,
                       *_compiled(stats, self.evaluator.cache_stats))

    def close(self) -> None:
        if self._evaluator is not None:
            self._evaluator.close()
            self._evaluator = None
