"""Running an experiment: one study per (problem, strategy, seed), with live progress.

Several processes (``evotune worker``) may run one experiment together: which
studies each takes up, alone or beside the others, is :mod:`evotune.running.schedule`'s
choice, and every point is claimed before it is measured (:mod:`evotune.storage.claims`).

Example::

    from evotune.running.experiment import load_experiment
    from evotune.running.runner import run_experiment
    results = run_experiment(load_experiment("experiments/quickstart.toml"))
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from evotune.core import hardware as hw
from evotune.core.landscape import Landscape, LandscapeError, load_landscape
from evotune.core.plugins import load_space
from evotune.core.space import Context
from evotune.core.tuned_cache import read_tuned
from evotune.measurement.base import Evaluator
from evotune.measurement.replay import ReplayEvaluator
from evotune.measurement.space_worker import SpaceWorker
from evotune.running import shared_baselines
from evotune.running.confirmation import confirm_target, confirmation_turn, search_budget
from evotune.running.cost_model import WorkerCosts
from evotune.running.experiment import Experiment, ExperimentError
from evotune.running.resume import budget_attr, check_resume, plain
from evotune.running.schedule import Schedule
from evotune.running.target import Target, group_name, study_attrs, study_name, study_names
from evotune.running.tuner import TuneResult, finished, tune
from evotune.search.strategies import STRATEGIES, Source, make_strategy
from evotune.search.transfer import from_cache, from_landscape, from_studies, shipped_landscapes
from evotune.storage.claims import Claims, make_claims
from evotune.storage.journal import JournalError
from evotune.storage.study import StudyStore, create_database, make_storage
from evotune.storage.trial_writer import checkpoint

if TYPE_CHECKING:  # imported where a run measures on a GPU
    from evotune.measurement.gpu import GpuEvaluator


def _with_compiled(exp: Experiment, t: Target) -> Target:
    """``t`` with the compile-only file of its space, GPU, dtype and layout in its context, when there is one:
    the space's estimate (hardware seeding) then reads registers, shared memory and stages off the binaries."""
    from evotune.core.compile_results import CompiledError, find_compiled, load_compiled

    assert exp.compiled_dir is not None  # targets() calls this only for an experiment that names the folder
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
            out.append(Target(ls.problem, space if name == "landscape" else ls.replayed(space),
                              Context(hardware, ls.problem), ls))
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
    if exp.oracle != "replay":
        check_needs(exp, resolved)
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


def check_needs(exp: Experiment, resolved: list[Target]) -> None:
    """Refuse, in one line, a space whose compiler or DSL this machine lacks (``SearchSpace.needs``): else every
    point would be compiled, fail the same way and be stored as failed."""
    for space in {t.space.name: t.space for t in resolved}.values():
        missing = space.needs.missing()
        if missing:
            raise ExperimentError(exp.path, "space", f"{space.name!r} cannot compile on this machine, which "
                                  f"lacks {' and '.join(missing)}")


def _gpu_evaluator_class(exp: Experiment) -> type[GpuEvaluator]:
    # The GPU worker imports torch in its own process; without it every point would fail there, one by one.
    if importlib.util.find_spec("torch") is None:
        raise ExperimentError(exp.path, "oracle.kind", "'gpu' needs the gpu extra and a CUDA GPU (torch is not "
                                                       "installed: pip install '.[gpu]' in the evotune clone)")
    from evotune.measurement.gpu import GpuEvaluator

    return GpuEvaluator


def start_measuring(exp: Experiment, resolved: list[Target]) -> None:
    """On a GPU, start the process the measuring and compile processes fork from, so that its imports (torch,
    the spaces' compilers: seconds) run while the caller opens its storage and studies."""
    if exp.oracle == "gpu":
        _gpu_evaluator_class(exp)  # refuses a machine without torch first
        from evotune.measurement.gpu import start_processes

        start_processes(t.space for t in resolved)


def make_evaluator(exp: Experiment, target: Target, worker: SpaceWorker | None = None) -> Evaluator:
    """The evaluator of ``target``'s space; ``worker``: a measuring process another space's evaluator started."""
    if exp.oracle == "replay":
        assert target.landscape is not None
        return ReplayEvaluator(target.landscape)
    if exp.oracle == "cpu":
        from evotune.measurement.cpu import CpuEvaluator

        return CpuEvaluator(target.space, target.ctx, exp.oracle_options, worker=worker)
    return _gpu_evaluator_class(exp)(target.space, target.ctx, exp.oracle_options, worker=worker)


@contextmanager
def progress_bar(console: Console, enabled: bool) -> Iterator[Progress | None]:
    """The live bars of ``run`` and ``record``: one task per study, trials against its total, best, time, ETA."""
    if not enabled:
        yield None
        return
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        yield progress


def run_experiment(exp: Experiment, console: Console | None = None, progress: bool = True,
                   resolved: list[Target] | None = None, draw_seed: int = 0, split: str = "problems",
                   costs: WorkerCosts | None = None, resume_finished: bool = True) -> list[TuneResult]:
    """Tune every (problem, strategy, seed) of ``exp`` to its budget; resumes what the storage already holds.

    Everything that can be wrong with the experiment is checked before the
    storage is opened, so a bad file leaves nothing behind. Beside other
    workers, ``split`` says what this one takes (see :mod:`evotune.running.schedule`), a
    study it runs alone proposes as a lone run would, and one it shares draws from
    ``draw_seed`` on top of its seed; ``costs`` is told each problem's time. Without ``resume_finished``, a
    study whose budget is spent is not resumed (a worker that joins late).
    """
    console = console or Console(stderr=True)
    if resolved is None:
        resolved = targets(exp)
        preflight(exp, resolved)
    start_measuring(exp, resolved)
    storage = open_storage(exp)
    check_resume(exp, resolved, storage, console)  # a changed option is refused before anything else is said
    console.print(f"[bold]evotune[/] {exp.name}: space {', '.join(exp.spaces)}, oracle {exp.oracle}, "
                  f"strategies {', '.join(s.name for s in exp.strategies)}, storage {exp.storage}")
    runs = [(spec, seed) for spec in exp.strategies for seed in spec.seeds]
    groups = [(group_name(exp, t), study_names(exp, t)) for t in resolved]
    schedule = Schedule(exp.storage, exp.name, groups, split)
    of_study = {name: g for g, (_, names) in enumerate(groups) for name in names}

    claims_of: dict[str, Claims] = {}

    def unfinished(name: str) -> bool:
        """Whether study ``name`` wants more points: its budget is not spent, and not held by its workers."""
        t = resolved[of_study[name]]
        store = StudyStore.load(storage, name, t.space)
        if store is None:
            return True
        # a replay evaluator is made for one problem at a time, and never holds time back for a confirmation
        budget = exp.budget if exp.oracle == "replay" else search_budget(exp, evaluators.get(t))
        if finished(store.history(), budget, len(t.space.feasible(t.ctx))):
            return False
        if exp.budget.trials is None:
            return True
        if name not in claims_of:  # asked again on every pass of the schedule: one claims object per study
            claims_of[name] = make_claims(exp.storage, name)
        return claims_of[name].room(exp.budget.trials) > 0

    results: list[TuneResult] = []
    ended: set[str] = set()
    with progress_bar(console, progress) as bar, Evaluators(exp) as evaluators:
        try:
            for g, turns in itertools.groupby(schedule.turns(unfinished, resume_finished), key=lambda turn: turn.group):
                target, began, done = resolved[g], time.perf_counter(), len(results)
                evaluator = evaluators.get(target)
                before = dict(evaluator.cache_stats)
                measure_baselines(exp, target, evaluators, storage, exp.storage, groups[g][1][0])
                sources: dict[str, list[Source]] = {}  # the other problems' studies stay as they are meanwhile
                for turn in turns:
                    spec, seed = runs[turn.study]
                    if spec.name not in sources:
                        sources[spec.name] = transfer_sources(exp, target, storage, spec.name, spec.options)
                    results.append(_run_one(exp, target, evaluator, storage, spec.name, seed, spec.options, bar,
                                            0 if turn.whole else draw_seed, sources[spec.name]))
                    ended.add(results[-1].study_name)
                with confirmation_turn(exp, target, evaluator, storage, schedule, g, ended) as stores:
                    if stores:
                        confirm_target(exp, target, evaluator, stores, console)
                summary = cache_summary(evaluator, before)
                if summary:
                    console.print(f"  compiled-kernel cache for {target.problem.key}: {summary}")
                if costs is not None:
                    costs.took(time.perf_counter() - began, results[done:])
        finally:
            schedule.release()
    checkpoint(storage)  # not on the way out of an error: it is the error that is raised
    return results


class Evaluators:
    """The evaluators of one run, made on first use. One measuring process (a GPU or CPU worker: its start-up,
    its CUDA context) serves every problem and every space of the run, each space's evaluator through a view of
    it (:mod:`evotune.measurement.space_worker`), and its device is read once; so those costs are paid once per
    worker, not once per problem or space. A replay evaluator answers for its one landscape and is closed when
    the next is asked for.

    Example::

        with Evaluators(exp) as evaluators:
            for target in targets(exp):
                evaluators.get(target).evaluate(point, target.problem)
    """

    def __init__(self, exp: Experiment):
        self.exp = exp
        self._open: dict[str, Evaluator] = {}
        self._device: dict | None = None

    def get(self, target: Target) -> Evaluator:
        key = target.problem.key if self.exp.oracle == "replay" else target.space.name
        if key not in self._open:
            if self.exp.oracle == "replay":
                self.close()
            shared = next((ev.shared_worker for ev in self._open.values()), None)
            self._open[key] = make_evaluator(self.exp, target, shared)
        return self._open[key]

    def device_info(self, evaluator: Evaluator) -> dict:
        """The device the measuring process runs on (its clocks, versions, copy bandwidth), read once."""
        if self._device is None:
            self._device = evaluator.device_info()
        return self._device

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
    except JournalError:  # a journal's broken record: it names the file and the line already
        raise
    except Exception as exc:  # any storage driver error: the URL is what the user can fix
        raise ExperimentError(exp.path, where, f"cannot open {url!r}: {exc}") from None


def measure_baselines(exp: Experiment, target: Target, evaluators: Evaluators, storage: optuna.storages.BaseStorage,
                      url: str, home: str) -> None:
    """On a GPU: the device and the baselines, timed by the same oracle in the same worker before the search, or
    taken from study ``home`` (in ``storage``, at ``url``) where another worker timed them on a device of the same
    model and versions."""
    if exp.oracle != "gpu" or target.baselines:
        return
    evaluator = evaluators.get(target)
    claims = make_claims(url, shared_baselines.namespace(exp.name))
    found = shared_baselines.shared_baselines(storage, home, claims, evaluators.device_info(evaluator),
                                              lambda: evaluator.baselines(target.problem))
    target.device, target.baselines, target.baselines_by = found.device_info, found.baselines, found.describe()


def cache_summary(evaluator: Evaluator, before: dict[str, int] | None = None) -> str:
    """The compiled-kernel cache's counts so far, or since ``before`` ("" for evaluators without one)."""
    stats = evaluator.cache_stats
    if not stats:
        return ""
    before = before or {}
    hit, miss, memory = (stats.get(k, 0) - before.get(k, 0) for k in ("hit", "miss", "memory"))
    return f"{hit} hits, {miss} misses, {memory} in memory"


@functools.lru_cache(maxsize=128)
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
    named: list[Path | str] = []
    for n in exp.sources:
        named += shipped_landscapes(target.space) if n == "shipped" else [n]
    measured_on = {p.resolve() for p in exp.landscapes}  # a replay's own files: the answer, never a source
    for n in dict.fromkeys(named):
        if n == "cache":
            found += from_cache(read_tuned(), target.space, target.problem, device)
            continue
        assert isinstance(n, Path)
        if n.resolve() in measured_on:
            continue
        try:
            stat = n.stat()
            ls = _source_landscape(n, stat.st_mtime_ns, stat.st_size)
        except (LandscapeError, OSError) as exc:
            raise ExperimentError(exp.path, "sources", str(exc)) from None
        source = from_landscape(ls, target.problem, device)
        if source.distance > 0 or ls.problem.key != target.problem.key:
            found.append(source)
    return found


def _run_one(exp: Experiment, target: Target, evaluator: Evaluator, storage: str | optuna.storages.BaseStorage,
             strategy: str, seed: int, options: dict, bar: Progress | None, draw_seed: int = 0,
             sources: list[Source] | None = None) -> TuneResult:
    name = study_name(exp, target, strategy, seed)
    sources = sources or []
    attrs = study_attrs(exp, target, strategy, seed)
    attrs.update(options=plain(options), budget=budget_attr(exp.budget))  # what a resume is checked against
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

    # a claim outlives any honest evaluation; a killed worker's claims lapse at once (storage/claims/base.py)
    lease = 3.0 * exp.oracle_options.timeout_s if exp.oracle in ("gpu", "cpu") else 120.0
    return tune(target.space, target.ctx, evaluator, strat, store, search_budget(exp, evaluator), on_trial,
                claims=make_claims(exp.storage, name, lease))
