"""Dense keys tuned with a built-in GEMM space, in evotune's one tuning loop, as ``python -m evotune run`` tunes a
problem.

The families whose name is a built-in space: decode keys (M <= 64) with ``triton_decode_gemm`` (split-K over the
weight stream; bf16, fp8 scaled per tensor), block-fp8 keys with ``triton_block_fp8`` (DeepSeek-V3's 128 x 128
weight blocks, vLLM's grid), and fp8 GEMM keys above the decode range with ``triton_matmul``. A key is a GEMM
problem ``y = x W^T`` (layout ``tn``: the layer's K-contiguous weight), tuned in one study
(:func:`evotune.running.tuner.tune_study`) measured by the GPU evaluator (the compile pool and the GPU worker
process: build, verify, time with the oracle), searched by the ``default`` strategy with the run's other keys of
the space on this GPU as its transfer sources; then the fastest configurations are re-timed beside the untuned
baseline in the confirmation stage (:func:`evotune.running.confirmation.confirm_best`: interleaved rounds, in one
process). The confirmed fastest configuration is the decision; the ratio is the baseline's confirmed time over
it: cuBLAS (``torch.matmul``, ``torch._scaled_mm``) for the decode and GEMM families, vLLM's default configuration
(the space's named one) for block-fp8, as vLLM launches it without a tuned file.

The studies live in the run's ``OUT/autotune.db`` (one per key, named by the run, the device, the problem and the
space), so an interrupted key resumes from its trials and nothing is timed twice; each point is claimed before it
is measured (:mod:`evotune.storage.claims`). The decision goes to ``tuned.json`` through the run's outcome
(:func:`evotune.model.exports.write_tuned`), where ``lookup(Problem.gemm(M, N, K, dtype, "tn", scaling),
space=FAMILY)`` finds it; a block-fp8 decision goes to vLLM's and SGLang's block-fp8 files too.
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
from evotune.model.plan import DEFAULT_BUDGET, Family, Key, scaling_of
from evotune.model.runner import autotune_cache
from evotune.running.confirmation import ConfirmationRecord, confirm_best
from evotune.running.tuner import tune_study
from evotune.search.strategies import make_strategy
from evotune.search.transfer import SettledTrials, from_studies
from evotune.storage.claims import make_claims
from evotune.storage.study import StudyStore, make_storage, timing_seconds

#: the families tuned here (each its space's name)
FAMILIES = (Family.DECODE, Family.GEMM, Family.BLOCK_FP8)
LAYOUT = "tn"  # the layer's weight, K-contiguous: what the kernels stream
STRATEGY = "default"
#: the untuned baseline of block-fp8: the space's named configuration, vLLM's default (the confirmation's label)
VLLM_DEFAULT = "vLLM default"
#: the confirmation stage of one key: the fastest few re-timed beside the baselines, a few seconds of rounds (a
#: key's search is 64 evaluations: the stage stays a small part of it)
CONFIRM = ConfirmOptions(top_k=3, screen_max=8, max_rounds=30, max_seconds=6.0, warmup_s=0.5)
CONFIRMATION = "confirmation"  # the study attribute holding the key's confirmation record, once it is done
CLAIM_LEASE_S = 900.0  # a claim outlives any honest evaluation (the oracle's timeout is 300 s); a dead worker's
#                        lapses at once

#: makes the evaluator of a space, sharing the measuring process of one made before when given
EvaluatorFactory = Callable[[SearchSpace, Evaluator | None], Evaluator]


def gpu_evaluator(space: SearchSpace, shared: Evaluator | None = None) -> Evaluator:
    """The GPU evaluator ``run`` uses (compile pool, GPU worker, oracle, baselines, confirmation rounds); one GPU
    worker process for every space of the run."""
    from evotune.measurement.gpu import GpuEvaluator

    return GpuEvaluator(space, OracleOptions(confirm=CONFIRM), worker=getattr(shared, "shared_worker", None))


def problem_of(key: Key, dtype: str) -> Problem:
    """The key's GEMM problem: fp8 scaled per tensor on the decode family, per 128 x 128 block on block-fp8."""
    return Problem.gemm(key.m, key.shape.n, key.shape.k, dtype, LAYOUT, scaling_of(key.shape.family, dtype))


@dataclass(frozen=True)
class Decided:
    """A key's decision: the configuration, its confirmed time, the baseline's, and how it was decided."""

    point: Point
    time_ms: float | None
    untuned_ms: float | None
    how: str  # "confirmed" (re-timed beside the baseline) or "searched" (the search's time; no confirmation record)


def decide(measured: list[tuple[float, Point]], record: ConfirmationRecord | None,
           key_of: Callable[[Point], str], baseline: Callable[[str], bool]) -> Decided:
    """The fastest configuration by the confirmation ``record`` (its items keyed by point key and by baseline
    name), or by the search's times where there is none; beside it the confirmed median of the baseline items
    ``baseline`` names (the fastest of them)."""
    by_key = {key_of(p): p for _, p in measured}
    items = record.timed.get("items", {}) if record is not None else {}
    confirmed = {k: float(v["median_ms"]) for k, v in items.items() if k in by_key}
    baselines = [float(v["median_ms"]) for k, v in items.items() if k not in by_key and baseline(k)]
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


class StudyTuner:
    """Tunes keys of :data:`FAMILIES` into the run's ``OUT/autotune.db``, ``budget`` evaluations a key.

    ``evaluator``: makes each space's evaluator (the GPU's by default; the tests give a stand-in); ``hardware``: the
    GPU the spaces' limits are read for (detected on first use by default)."""

    def __init__(self, out: Path, dtype: str, run: str, budget: int = DEFAULT_BUDGET,
                 evaluator: EvaluatorFactory = gpu_evaluator, hardware: Hardware | None = None, seed: int = 0):
        self.url = autotune_cache(out)
        self.dtype, self.run, self.budget, self.seed = dtype, run, budget, seed
        self._make_evaluator = evaluator
        self._spaces: dict[Family, SearchSpace] = {}
        self._evaluators: dict[str, Evaluator] = {}
        self._hardware = hardware
        self.console = Console(stderr=True)
        # a key's study is done once its confirmation is recorded (this worker's or another's)
        self._settled = SettledTrials(lambda summary: CONFIRMATION in summary.user_attrs)

    @property
    def hardware(self) -> Hardware:
        if self._hardware is None:
            self._hardware = detect()
        return self._hardware

    def space(self, family: Family) -> SearchSpace:
        if family not in self._spaces:
            self._spaces[family] = load_space(family.value)
        return self._spaces[family]

    def evaluator(self, space: SearchSpace) -> Evaluator:
        if space.name not in self._evaluators:
            shared = next(iter(self._evaluators.values()), None)
            self._evaluators[space.name] = self._make_evaluator(space, shared)
        return self._evaluators[space.name]

    def problem(self, key: Key) -> Problem:
        return problem_of(key, self.dtype)

    def study_name(self, problem: Problem, space: SearchSpace) -> str:
        """``RUN/DEVICE/PROBLEM/SPACE/STRATEGY/seedN``: one study per key and device."""
        return f"{self.run}/{self.hardware.name}/{problem.key}/{space.name}/{STRATEGY}/seed{self.seed}"

    def tune(self, key: Key) -> Outcome:
        started = time.perf_counter()
        space = self.space(key.shape.family)
        evaluator = self.evaluator(space)
        problem = self.problem(key)
        ctx = Context(self.hardware, problem)
        feasible = space.feasible(ctx)
        if not len(feasible):
            raise RuntimeError(f"{key.ident}: no configuration of {space.name} is feasible on {self.hardware.name}")
        storage = make_storage(self.url)
        name = self.study_name(problem, space)
        attrs = {"experiment": self.run, "space": space.name, "space_source": space.name,
                 "problem": problem.to_dict(), "problem_key": problem.key, "strategy": STRATEGY, "seed": self.seed,
                 "oracle": evaluator.kind, "hardware": self.hardware.name, "feasible": len(feasible),
                 "space_size": space.size}
        store = StudyStore.open(storage, name, space, attrs)
        before = len(store.history())
        stats = dict(evaluator.cache_stats)  # the kernel cache's hits and misses (compiles) so far
        sources = from_studies(storage, space, problem, self.hardware.name, experiment=self.run,
                               settled=self._settled)
        strategy = make_strategy(STRATEGY, space, feasible, seed=self.seed, ctx=ctx, sources=sources)
        tune_study(space, ctx, evaluator, strategy, store, Budget(trials=min(self.budget, len(feasible))),
                   claims=make_claims(self.url, name, CLAIM_LEASE_S))
        history = store.history()
        measured = [(r.value, r.point) for r in history if r.value is not None]
        if not measured:
            raise RuntimeError(f"{key.ident}: every configuration of {space.name} failed ({len(history)} tried)")
        record = confirm_best(problem, evaluator, measured, space.to_storage, self.console, CONFIRM)
        if record is not None:
            store.study.set_user_attr(CONFIRMATION, record.to_attr())
        named = f"{space.name}: "
        untuned = (lambda label: label == named + VLLM_DEFAULT) if key.shape.family is Family.BLOCK_FP8 else \
            (lambda label: not label.startswith(named))  # the workload's cuBLAS baselines
        decided = decide(measured, record, space.key, untuned)
        import triton

        return Outcome(key.ident, key.shape.name, key.shape.family.value, key.fields(),
                       dict(space.to_storage(decided.point)), len(history), len(history) - before,
                       time.perf_counter() - started, decided.time_ms, decided.untuned_ms, decided.how,
                       # a time not measured on the GPU is never kept as the GPU's (tuned.json's oracle)
                       self.hardware.name if evaluator.kind == "gpu" else f"cpu-{evaluator.kind}",
                       str(triton.__version__), space.name, *_compiled(stats, evaluator.cache_stats),
                       timing_seconds(history[before:], None if record is None else record.timed))

    def close(self) -> None:
        for evaluator in reversed(list(self._evaluators.values())):  # the one that owns the shared worker last
            evaluator.close()
        self._evaluators.clear()
