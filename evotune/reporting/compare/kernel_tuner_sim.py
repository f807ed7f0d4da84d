"""Kernel Tuner's strategies (``kt:NAME``) in its simulation mode, on the same landscapes as evotune's.

Kernel Tuner (``pip install '.[bench]'``) runs ``kernel_tuner.tune_cache``
on a temporary, uncompressed Kernel Tuner copy of each landscape; the
configurations it evaluated, in order and without repeats, are mapped back to
the landscape's times so that the same metrics apply.

Kernel Tuner's strategies draw from Python's ``random`` and NumPy's global
generator, and scipy's Latin hypercube sampler, which Kernel Tuner leaves
unseeded, draws from the operating system. :func:`seeded_globals` seeds the two
generators and makes the sampler take its seed from NumPy's stream, so a seed
gives the same sequence of evaluations in this process and across processes;
it puts all three back as they were afterwards, so that nothing else running in
the process (evotune's strategies, a caller's own draws) sees a changed generator
or a patched scipy. :data:`KT_CAVEAT` applies to every comparison.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from evotune.core.landscape import Landscape
from evotune.core.result import Status
from evotune.reporting.compare.metrics import Run, time_of

KT_PREFIX = "kt:"
KT_STRATEGIES = ("genetic_algorithm", "pso", "simulated_annealing", "dual_annealing", "diff_evo",
                 "firefly_algorithm", "random_sample")
#: Kernel Tuner strategies whose proposals depend on max_fevals: one run per budget
KT_BUDGET_DEPENDENT = frozenset({"simulated_annealing", "dual_annealing"})
KT_CAVEAT = ("Kernel Tuner's tune_cache simulation searches only the error-free entries of a file, "
             "while evotune pays for failing ones.")


class KernelTunerFailed(Exception):
    """Kernel Tuner raised while simulating; the message is one line."""


def budget_dependent(strategy: str) -> bool:
    """Whether a strategy's proposals depend on its budget (then each budget is its own run)."""
    return strategy.startswith(KT_PREFIX) and strategy.removeprefix(KT_PREFIX) in KT_BUDGET_DEPENDENT


class KernelTunerSim:
    """Kernel Tuner's strategies in simulation mode on temporary copies of the landscapes in ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._files: dict[str, tuple[Path, list[dict[Any, Any]]]] = {}

    def cache_file(self, name: str, landscape: Landscape) -> tuple[Path, list[dict[Any, Any]]]:
        """An uncompressed Kernel Tuner cache file of the landscape, and per parameter KT value -> choice."""
        if name not in self._files:
            doc, inverse = kt_cache_document(landscape)
            path = self.folder / f"{name}.json"
            path.write_text(json.dumps(doc))
            self._files[name] = (path, inverse)
        return self._files[name]

    def run(self, name: str, landscape: Landscape, strategy: str, seed: int, budget: int) -> Run:
        """Kernel Tuner's ``strategy`` (without ``kt:``) on landscape ``name``, up to ``budget`` distinct points."""
        from kernel_tuner import tune_cache

        path, inverse = self.cache_file(name, landscape)
        names = landscape.names
        try:
            with seeded_globals(seed), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                results, _ = tune_cache(str(path), strategy=strategy, strategy_options={"max_fevals": budget},
                                        quiet=True)
        except Exception as exc:  # Kernel Tuner raises anything: name it on one line
            raise KernelTunerFailed(f"kt:{strategy}: Kernel Tuner failed: {type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        seen: set[tuple[Any, ...]] = set()
        times: list[float] = []
        steps: list[float] = []
        for r in results:
            if not r or "__error__" in r:
                continue  # a configuration outside its search space: Kernel Tuner does not count it either
            key = tuple(inv[r[n]] for inv, n in zip(inverse, names, strict=True))
            if key in seen:
                continue  # a repeat is served from its cache, free
            seen.add(key)
            times.append(time_of(landscape.entries.get(key)))
            steps.append(float(r.get("strategy_time") or 0.0))
            if len(times) >= budget:
                break
        return Run(np.array(times, dtype=float), np.array(steps, dtype=float))


def _kt_value(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float, str)) else json.dumps(v)


def kt_cache_document(ls: Landscape) -> tuple[dict[str, Any], list[dict[Any, Any]]]:
    """The landscape as a Kernel Tuner cache file (failed entries included), and the value maps back."""
    names = ls.names
    inverse = [{_kt_value(c): c for c in p.choices} for p in ls.params]
    cache = {}
    for key, res in ls.entries.items():
        values = [_kt_value(v) for v in key]
        entry: dict[str, Any] = dict(zip(names, values, strict=True))
        if res.status is Status.OK:
            entry["time"] = res.time_ms
            entry["times"] = list(res.samples_ms)
        else:
            entry["time"] = "CompilationFailedConfig" if res.status is Status.COMPILE_ERROR else "RuntimeFailedConfig"
        entry.update(compile_time=res.compile_s * 1e3, verification_time=0.0, benchmark_time=res.bench_s * 1e3)
        cache[",".join(str(v) for v in values)] = entry
    size = ls.meta.get("problem_size")
    if not (isinstance(size, int) or (isinstance(size, list) and all(isinstance(x, int) for x in size))):
        size = 1
    doc = {"device_name": str(ls.meta.get("device") or "unknown"), "kernel_name": ls.problem.kind or "kernel",
           "problem_size": size, "tune_params_keys": names,
           "tune_params": {p.name: [_kt_value(c) for c in p.choices] for p in ls.params},
           "objective": "time", "cache": cache}
    return doc, inverse


@contextlib.contextmanager
def seeded_globals(seed: int) -> Iterator[None]:
    """Seed Python's and NumPy's global generators, and scipy's Latin hypercube from them; restore all three after.

    Kernel Tuner offers no seed of its own, so the process-wide generators are the
    only way to make its runs repeatable. They are restored (and the sampler
    unpatched) on the way out, errors included: the process's other users of
    ``random``, ``np.random`` and ``scipy.stats.qmc`` must not depend on whether a
    ``kt:`` strategy ran before them.
    """
    import scipy.stats.qmc as qmc

    py_state, np_state = random.getstate(), np.random.get_state()
    original = qmc.LatinHypercube
    # scipy renamed the sampler's seed argument to rng; seed whichever this scipy takes
    seed_kw = "rng" if "rng" in inspect.signature(original).parameters else "seed"

    def seeded_latin_hypercube(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rng") is None and kwargs.get("seed") is None:
            kwargs[seed_kw] = int(np.random.randint(2**31 - 1))
        return original(*args, **kwargs)

    random.seed(seed)
    np.random.seed(seed)
    qmc.LatinHypercube = seeded_latin_hypercube
    try:
        yield
    finally:
        qmc.LatinHypercube = original
        random.setstate(py_state)
        np.random.set_state(np_state)
