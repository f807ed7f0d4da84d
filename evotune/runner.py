"""Running an experiment: one study per (problem, strategy, seed), with live progress.

Example::

    from evotune.experiment import load_experiment
    from evotune.runner import run_experiment
    results = run_experiment(load_experiment("experiments/quickstart.toml"))
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from evotune import hardware as hw
from evotune.claims import make_claims
from evotune.evaluation.base import Evaluator
from evotune.evaluation.landscape import Landscape, LandscapeError, load_landscape
from evotune.evaluation.options import ConfirmOptions
from evotune.evaluation.replay import ReplayEvaluator
from evotune.evaluation.space_worker import SpaceWorker
from evotune.experiment import Experiment, ExperimentError
from evotune.lookup import read_tuned
from evotune.plugins import load_space
from evotune.problem import Problem
from evotune.space import Context, SearchSpace
from evotune.strategies import STRATEGIES, Source, make_strategy
from evotune.study import StudyStore, create_database, make_storage
from evotune.transfer import from_cache, from_landscape, from_studies
from evotune.tuner import TuneResult, tune


@dataclass
class Target:
    """One problem to tune, with its space, context and (for replay) landscape."""

    problem: Problem
    space: SearchSpace
    ctx: Context
    landscape: Landscape | None = None
    baselines: dict = field(default_factory=dict)  # name -> timing, measured beside the candidates
    device: dict = field(default_factory=dict)  # what the numbers depend on: device, clocks, versions


def study_name(exp: Experiment, target: Target, strategy: str, seed: int | None = None) -> str:
    """``EXPERIMENT/PROBLEM/SPACE/STRATEGY/seedN``: one study per run."""
    tail = f"/seed{seed}" if seed is not None else ""
    return f"{exp.name}/{target.problem.key}/{target.space.name}/{strategy}{tail}"


def _with_compiled(exp: Experiment, t: Target) -> Target:
    """``t`` with the compile-only file of its space, GPU, dtype and layout in its context, when there is one:
    the space's estimate (hardware seeding) then reads registers, shared memory and stages off the binaries."""
    from evotune.compiled import CompiledError, find_compiled, load_compiled

    hw_, p = t.ctx.hardware, t.problem
    path = None if hw_ is None or p.kind != "gemm" else find_compiled(exp.compiled_dir, t.space.name, hw_.name,
                                                                      p.dtype, p.layout)
    if path is None:
        return t
    try:
        table = load_compiled(path, t.space)
    except CompiledError as exc:
        raise ExperimentError(exp.path, "compiled", str(exc)) from None
    return replace(t, ctx=Context(hw_, p, compiled=table))


def targets(exp: Experiment) -> list[Target]:
    """Resolve the experiment's problems, spaces and hardware; every error names its field."""
    hardware = None
    if exp.hardware is not None:
        try:
            hardware = hw.get_hardware(exp.hardware)
        except RuntimeError as exc:
            raise ExperimentError(exp.path, "hardware", f"'auto' found no GPU ({exc})") from None
    out = []
    if exp.oracle == "replay":
        (name,) = exp.spaces
        for path in exp.landscapes:
            try:
                ls = load_landscape(path)
            except LandscapeError as exc:
                raise ExperimentError(exp.path, "oracle.landscapes", str(exc)) from None
            space = ls.space() if name == "landscape" else load_space(name, exp.base_dir)
            if name != "landscape" and ls.names != space.names:
                raise ExperimentError(exp.path, "space", f"{name!r} has parameters {space.names}, but "
                                      f"landscape {path.name} records {ls.names}")
            out.append(Target(ls.problem, space, Context(hardware, ls.problem), ls))
    else:
        for name in exp.spaces:
            space = load_space(name, exp.base_dir)
            out += [Target(p, space, Context(hardware, p)) for p in exp.problems]
    if exp.compiled_dir is not None:
        out = [_with_compiled(exp, t) for t in out]
    for t in out:
        # a recorded kernel of no workload's kind (a Kernel Tuner file's) promises nothing to check against
        if t.problem.workload is not None and t.space.workload != t.problem.kind:
            raise ExperimentError(exp.path, "space", f"{t.space.name!r} serves {t.space.workload!r} problems, "
                                  f"not {t.problem.kind!r} ({t.problem.describe()})")
        if len(t.space.feasible(t.ctx)) == 0:
            pruned = ", ".join(f"{k} ({v})" for k, v in t.space.feasible(t.ctx).pruned.most_common(3))
            raise ExperimentError(exp.path, "space", f"every point of {t.space.name!r} is infeasible for "
                                  f"{t.problem.describe()} on {exp.hardware}: pruned by {pruned}")
    return out


def preflight(exp: Experiment, resolved: list[Target]) -> None:
    """Check what the evaluator needs and build each strategy once, so that a space that cannot run or a
    bad option fails before any storage is touched."""
    if exp.oracle == "gpu":
        _gpu_evaluator_class(exp)
    for target in resolved:
        if exp.oracle != "replay" and target.space.build is None:
            # the CPU and GPU evaluators build every point with it, in a worker that loads the space by source
            raise ExperimentError(exp.path, "space", f"{target.space.source or target.space.name} defines SPACE "
                                  f"without build(point, problem), which oracle.kind = {exp.oracle!r} needs to "
                                  "run a point")
        for spec in exp.strategies:
            try:
                make_strategy(spec.name, target.space, target.space.feasible(target.ctx), seed=spec.seed,
                              ctx=target.ctx, budget=exp.budget.trials, **spec.options)
            except ValueError as exc:
                raise ExperimentError(exp.path, f"{spec.where}.options", str(exc)) from None


def _gpu_evaluator_class(exp: Experiment) -> type[Evaluator]:
    # The GPU worker imports torch in its own process; without it every point would fail there, one by one.
    if importlib.util.find_spec("torch") is None:
        raise ExperimentError(exp.path, "oracle.kind", "'gpu' needs the gpu extra and a CUDA GPU "
                                                       "(torch is not installed: pip install 'evotune[gpu]')")
    from evotune.evaluation.gpu import GpuEvaluator

    return GpuEvaluator


def make_evaluator(exp: Experiment, target: Target, worker: SpaceWorker | None = None) -> Evaluator:
    """The evaluator of ``target``'s space; ``worker``: a measuring process another space's evaluator started."""
    if exp.oracle == "replay":
        assert target.landscape is not None
        return ReplayEvaluator(target.landscape)
    if exp.oracle == "cpu":
        from evotune.evaluation.cpu import CpuEvaluator

        return CpuEvaluator(target.space, target.ctx, exp.oracle_options, worker=worker)
    return _gpu_evaluator_class(exp)(target.space, target.ctx, exp.oracle_options, worker=worker)


def study_attrs(exp: Experiment, target: Target, strategy: str, seed: int) -> dict:
    attrs = {
        "experiment": exp.name, "space": target.space.name, "problem": target.problem.to_dict(),
        "problem_key": target.problem.key, "strategy": strategy, "seed": seed, "oracle": exp.oracle,
        "hardware": target.ctx.hardware.name if target.ctx.hardware else None,
        "feasible": len(target.space.feasible(target.ctx)), "space_size": target.space.size,
    }
    if target.landscape is not None:
        ls = target.landscape
        attrs.update(landscape=str(ls.path), optimum_ms=ls.optimum_ms, device=ls.meta.get("device"),
                     baselines=ls.baselines)
    if target.device:
        attrs.update(device=target.device.get("device"), device_info=target.device)
    if target.baselines:
        attrs["baselines"] = target.baselines
    return attrs


@contextmanager
def _progress(console: Console, enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        yield progress


def run_experiment(exp: Experiment, console: Console | None = None, progress: bool = True,
                   resolved: list[Target] | None = None, draw_seed: int = 0) -> list[TuneResult]:
    """Tune every (problem, strategy, seed) of ``exp`` to its budget; resumes what the storage already holds.

    Everything that can be wrong with the experiment is checked before the
    storage is opened, so a bad file leaves nothing behind.
    """
    console = console or Console(stderr=True)
    if resolved is None:
        resolved = targets(exp)
        preflight(exp, resolved)
    storage = open_storage(exp)
    console.print(f"[bold]evotune[/] {exp.name}: space {', '.join(exp.spaces)}, oracle {exp.oracle}, "
                  f"strategies {', '.join(s.name for s in exp.strategies)}, storage {exp.storage}")
    results = []
    with _progress(console, progress) as bar, Evaluators(exp) as evaluators:
        for target in resolved:
            evaluator = evaluators.get(target)
            before = dict(getattr(evaluator, "cache_stats", None) or {})
            measure_baselines(exp, target, evaluator)
            for spec in exp.strategies:
                # the other problems' studies do not change while this problem's seeds run: read them once
                sources = transfer_sources(exp, target, storage, spec.name, spec.options)
                for seed in spec.seeds:
                    results.append(_run_one(exp, target, evaluator, storage, spec.name, seed, spec.options, bar,
                                            draw_seed, sources))
            confirm_target(exp, target, evaluator, storage, console)
            summary = cache_summary(evaluator, before)
            if summary:
                console.print(f"  compiled-kernel cache for {target.problem.key}: {summary}")
    return results


class Evaluators:
    """The evaluators of one run, made on first use. One measuring process (a GPU or CPU worker: its start-up,
    its CUDA context) serves every problem and every space of the run, each space's evaluator through a view of
    it (:mod:`evotune.evaluation.space_worker`); so those costs are paid once per worker, not once per problem
    or space. A replay evaluator answers for its one landscape and is closed when
    the next is asked for.

    Example::

        with Evaluators(exp) as evaluators:
            for target in targets(exp):
                evaluators.get(target).evaluate(point, target.problem)
    """

    def __init__(self, exp: Experiment):
        self.exp = exp
        self._open: dict[str, Evaluator] = {}

    def get(self, target: Target) -> Evaluator:
        key = target.problem.key if self.exp.oracle == "replay" else target.space.name
        if key not in self._open:
            if self.exp.oracle == "replay":
                self.close()
            shared = next((getattr(ev, "shared_worker", None) for ev in self._open.values()), None)
            self._open[key] = make_evaluator(self.exp, target, shared) if shared else make_evaluator(self.exp, target)
        return self._open[key]

    def close(self) -> None:
        for ev in self._open.values():
            ev.close()
        self._open.clear()

    def __enter__(self) -> Evaluators:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_storage(exp: Experiment, record: bool = False) -> optuna.storages.BaseStorage:
    """The experiment's storage, or with ``record`` the recording studies' own (made on a server when missing)."""
    url, where = (exp.record_storage, "storage.record_url") if record else (exp.storage, "storage.url")
    try:
        if record:
            create_database(url)
        return make_storage(url)
    except Exception as exc:  # any storage driver error: the URL is what the user can fix
        raise ExperimentError(exp.path, where, f"cannot open {url!r}: {exc}") from None


def measure_baselines(exp: Experiment, target: Target, evaluator: Evaluator) -> None:
    """On a GPU: the device and the baselines, timed by the same oracle in the same worker, before the search."""
    if exp.oracle == "gpu":
        target.device = evaluator.device_info()
        target.baselines = evaluator.baselines(target.problem)


def confirm_target(exp: Experiment, target: Target, evaluator: Evaluator, storage: optuna.storages.BaseStorage,
                   console: Console) -> dict | None:
    """The confirmation stage for one problem and space: its best configurations over every study of the
    experiment, re-timed beside the baselines; the record is kept in each of those studies."""
    if not evaluator.confirms or exp.oracle_options.confirm.top_k <= 0:
        return None
    stores = [StudyStore.open(storage, study_name(exp, target, spec.name, seed), target.space)
              for spec in exp.strategies for seed in spec.seeds]
    best: dict[str, tuple[float, dict]] = {}
    for store in stores:
        for r in store.history():
            if r.value is not None and (r.key not in best or r.value < best[r.key][0]):
                best[r.key] = (r.value, r.point)
    record = confirm_best(exp, target, evaluator, list(best.values()), target.space.to_storage, console)
    for store in stores if record is not None else []:
        store.study.set_user_attr("confirmation", record)
    return record


def confirm_best(exp: Experiment, target: Target, evaluator: Evaluator, measured: list[tuple[float, dict]],
                 config_form: Callable[[dict], Any], console: Console) -> dict | None:
    """Confirm the fastest of ``measured`` (search time, point) on ``evaluator``: the ``confirm.top_k`` fastest
    and the others within ``confirm.screen`` of the fastest (at most ``confirm.screen_max``), raced down to
    ``top_k``. The record, dated, its configurations written by ``config_form``, its warnings printed; None
    when off."""
    top = screened(measured, exp.oracle_options.confirm)
    record = evaluator.confirm([p for _, p in top], target.problem, [t for t, _ in top])
    if record is None:
        return None
    record["configs"] = {k: config_form(p) for k, p in record.get("configs", {}).items()}
    record["date"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    if "error" in record:
        console.print(f"  [yellow]confirmation of {target.problem.key} failed:[/] {record['error']}")
    for warning in record.get("warnings", []):
        console.print(f"  [yellow]{target.problem.key}:[/] {warning}")
    return record


def screened(measured: list[tuple[float, Any]], opts: ConfirmOptions) -> list[tuple[float, Any]]:
    """The candidates of the confirmation stage, fastest first: the ``top_k`` fastest of ``measured``
    (search time, point) and every other within ``screen`` of the fastest, ``screen_max`` at most."""
    ranked = sorted(measured, key=lambda t: t[0])
    if not ranked or opts.top_k <= 0:
        return []
    near = [t for t in ranked if t[0] <= ranked[0][0] * (1.0 + opts.screen)]
    return ranked[:max(opts.top_k, min(len(near), opts.screen_max))]


def cache_summary(evaluator: Evaluator, before: dict[str, int] | None = None) -> str:
    """The compiled-kernel cache's counts so far, or since ``before`` ("" for evaluators without one)."""
    stats = getattr(evaluator, "cache_stats", None)
    if not stats:
        return ""
    before = before or {}
    hit, miss, memory = (stats.get(k, 0) - before.get(k, 0) for k in ("hit", "miss", "memory"))
    return f"{hit} hits, {miss} misses, {memory} in memory"


@functools.lru_cache(maxsize=32)
def _source_landscape(path: Path, mtime_ns: int, size: int) -> Landscape:
    """A landscape named as a source, read once per version of the file: every (problem, strategy, seed) of a
    run asks for the same ones."""
    return load_landscape(path)


def transfer_sources(exp: Experiment, target: Target, storage: optuna.storages.BaseStorage, strategy: str,
                     options: dict) -> list[Source]:
    """For a strategy that transfers (unless its options say ``transfer = false``): the experiment's own studies
    of the same space for other problems, and the landscapes and the tuning-result cache its ``sources`` names
    (a landscape of this very problem on this very GPU is left out: it would be the answer); else none."""
    if not STRATEGIES[strategy].transfers or options.get("transfer") is False:
        return []
    device = target.ctx.hardware.name if target.ctx.hardware else (
        target.landscape.meta.get("device") if target.landscape is not None else None)
    found = from_studies(storage, target.space, target.problem, device, experiment=exp.name)
    for named in exp.sources:
        if named == "cache":
            found += from_cache(read_tuned(), target.space, target.problem, device)
            continue
        try:
            stat = named.stat()
            ls = _source_landscape(named, stat.st_mtime_ns, stat.st_size)
        except (LandscapeError, OSError) as exc:
            raise ExperimentError(exp.path, "sources", str(exc)) from None
        source = from_landscape(ls, target.problem, device)
        if source.distance > 0 or ls.problem.key != target.problem.key:
            found.append(source)
    return found


def _run_one(exp: Experiment, target: Target, evaluator: Evaluator, storage, strategy: str, seed: int,
             options: dict, bar: Progress | None, draw_seed: int = 0, sources: list[Source] | None = None
             ) -> TuneResult:
    name = study_name(exp, target, strategy, seed)
    sources = sources or []
    attrs = study_attrs(exp, target, strategy, seed)
    if sources:
        attrs["transfer_sources"] = [{"name": s.name, "distance": round(s.distance, 3)} for s in sources]
    store = StudyStore.open(storage, name, target.space, attrs)
    feasible = target.space.feasible(target.ctx)
    # The study is named by `seed`; a worker that joins it draws its proposals from `draw_seed` on top,
    # so that workers do not all propose the same points (and lose them to each other's claims).
    strat = make_strategy(strategy, target.space, feasible, seed=seed + draw_seed, ctx=target.ctx,
                          budget=exp.budget.trials, sources=sources, **options)
    task = None
    if bar is not None:
        total = min(exp.budget.trials, len(feasible)) if exp.budget.trials else None
        label = f"{target.problem.key[:28]} {target.space.name[:18]} {strategy} s{seed}"
        task = bar.add_task(label, total=total, best="-")

    def on_trial(n: int, best: float | None) -> None:
        if bar is not None and task is not None:
            bar.update(task, completed=n, best=f"{best:.4g} ms" if best is not None else "-")

    # a claim outlives any honest evaluation; a killed worker's claims lapse at once (see evotune/claims/base.py)
    lease = 3.0 * exp.oracle_options.timeout_s if exp.oracle in ("gpu", "cpu") else 120.0
    return tune(target.space, target.ctx, evaluator, strat, store, exp.budget, on_trial,
                claims=make_claims(exp.storage, name, lease))
