"""The session: one worker's run of an experiment, owning everything the run's policies share.

A session resolves the targets once (:func:`evotune.running.targets.resolve_targets`), and while open holds the storage,
the schedule, the measuring process and its evaluators, each problem's baselines, the transfer sources and the
live progress. ``run`` (:mod:`evotune.running.run`) and ``record`` (:mod:`evotune.running.record`) are policies
over it: which storage its studies live in (:class:`StudyStorage`), what to ask, with what budget, and what to
write after a group. (``record --compile-only``, :mod:`evotune.running.compile_only`, measures nothing: it
resolves the targets alone.)

A study is handed a :class:`StudyPlan` (its name, attributes, budget and claims), never the experiment.

Example::

    with Session(exp, StudyStorage.tuning(exp)) as session:
        for group, target, turns in session.groups(groups, wants_more):
            ...
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import optuna
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from evotune.core.budget import Budget
from evotune.core.landscape import LandscapeError
from evotune.core.plugins import load_space
from evotune.core.space import Point, SearchSpace
from evotune.core.tuned_cache import load_tuned
from evotune.measurement.base import Evaluator
from evotune.measurement.host import unplace
from evotune.measurement.replay import ReplayEvaluator
from evotune.measurement.space_worker import SpaceWorker
from evotune.running import shared_baselines
from evotune.running.confirmation import (
    ConfirmationRecord,
    confirm_best,
    confirmation_seconds,
    confirmation_turn,
    search_budget,
)
from evotune.running.experiment import Experiment, ExperimentError, OracleKind
from evotune.running.schedule import Schedule, Turn
from evotune.running.study_progress import TuneResult
from evotune.running.targets import Baselines, Target, gpu_evaluator_class, resolve_targets
from evotune.running.tuner import OnTrial, tune_study
from evotune.search.strategies import STRATEGIES, Source
from evotune.search.strategies.base import Strategy
from evotune.search.transfer import from_cache, from_landscape, from_studies, read_landscape, shipped_landscapes
from evotune.storage.claims import Claims, make_claims
from evotune.storage.journal import JournalError
from evotune.storage.study import StudyStore, create_database, make_storage
from evotune.storage.trial_writer import checkpoint

Groups = list[tuple[str, list[str]]]  # (group name, its study names), one per target
#: whether a study that holds trials (its target, its store) wants more points; one never started always does
WantsMore = Callable[[Target, StudyStore], bool]


@dataclass(frozen=True)
class StudyStorage:
    """Where a session's studies live: ``url``; ``fieldname``, the experiment file's field that gives it (named
    when it cannot be opened); ``create``: make the database first where it is missing (on a server)."""

    url: str
    fieldname: str
    create: bool = False

    @classmethod
    def tuning(cls, exp: Experiment) -> StudyStorage:
        """The tuning storage: what ``best``, ``plot`` and the dashboard read."""
        return cls(exp.storage, "storage.url")

    @classmethod
    def recording(cls, exp: Experiment) -> StudyStorage:
        """The recording studies' own storage, never the tuning one (see :mod:`evotune.running.record`)."""
        return cls(exp.record_storage, "storage.record_url", create=True)

    def open(self, exp: Experiment) -> optuna.storages.BaseStorage:
        """The storage, opened; an :class:`ExperimentError` on :attr:`fieldname` of ``exp`` when it cannot be."""
        try:
            if self.create:
                create_database(self.url)
            return make_storage(self.url)
        except JournalError:  # a journal's broken record: it names the file and the line already
            raise
        except Exception as exc:  # any storage driver error: the URL is what the user can fix
            raise ExperimentError(exp.path, self.fieldname, f"cannot open {self.url!r}: {exc}") from None


@dataclass(frozen=True)
class StudyPlan:
    """What one study is given: its name, its attributes (what a resume is checked against), its budget, the
    claims its points are taken through, and its progress bar's label and total."""

    name: str
    attrs: dict[str, Any]
    budget: Budget
    claims: Claims
    label: str
    total: int | None


class Session:
    """One worker's run of ``exp``: the targets resolved once; opened (``with``), the storage ``where`` its
    policy keeps its studies, the schedule, the evaluators, the baselines and the transfer sources."""

    def __init__(self, exp: Experiment, where: StudyStorage, *, console: Console | None = None,
                 progress: bool = True):
        self.exp = exp
        self.where = where
        self.console = console or Console(stderr=True)
        # the measuring processes' imports (seconds) run while the targets resolve, where they can start already
        self._measuring = start_measuring(exp)
        try:
            self.targets = resolve_targets(exp)
        except BaseException:
            unplace()  # the run ends here: this process goes back to its cores
            raise
        self._progress = progress
        self._stack = ExitStack()
        self._baselines: dict[str, Baselines] = {}
        self._storage: optuna.storages.BaseStorage | None = None
        self._evaluators: Evaluators | None = None
        self.schedule: Schedule | None = None
        self.bar: Progress | None = None

    # -- opening and closing -------------------------------------------------------------------------------------
    def __enter__(self) -> Session:
        if not self._measuring:  # its imports run while the storage opens
            start_measuring(self.exp, [t.space for t in self.targets])
        self._storage = self.where.open(self.exp)
        self._evaluators = self._stack.enter_context(Evaluators(self.exp))
        self.bar = self._stack.enter_context(progress_bar(self.console, self._progress))
        return self

    @property
    def storage(self) -> optuna.storages.BaseStorage:
        """The storage of the session's studies, open while the session is (inside ``with``)."""
        if self._storage is None:
            raise RuntimeError("the session's storage is open only inside `with session`")
        return self._storage

    @property
    def evaluators(self) -> Evaluators:
        """The run's evaluators, made on first use while the session is open (inside ``with``)."""
        if self._evaluators is None:
            raise RuntimeError("the session's evaluators exist only inside `with session`")
        return self._evaluators

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self.schedule is not None:
                self.schedule.release()
        finally:
            self._stack.close()
            unplace()
        if kind is None:  # not on the way out of an error: it is the error that is raised
            checkpoint(self.storage)

    # -- what the run takes up -----------------------------------------------------------------------------------
    def groups(self, groups: Groups, wants_more: WantsMore, split: str = "problems",
               resume_finished: bool = True) -> Iterator[tuple[int, Target, Iterable[Turn]]]:
        """The groups (one per target, in the targets' order) this worker takes up, as the schedule hands them
        (``split``, see :mod:`evotune.running.schedule`): (its index, its target, its turns: the studies to run
        now). A study is unfinished when it was never started or ``wants_more`` says so of what it holds."""
        of_study = {name: g for g, (_, names) in enumerate(groups) for name in names}

        def unfinished(name: str) -> bool:
            target = self.targets[of_study[name]]
            store = StudyStore.load(self.storage, name, target.space)
            return store is None or wants_more(target, store)

        self.schedule = Schedule(self.where.url, self.exp.name, groups, split)
        for g, turns in itertools.groupby(self.schedule.turns(unfinished, resume_finished), key=lambda t: t.group):
            yield g, self.targets[g], turns

    def evaluator(self, target: Target) -> Evaluator:
        return self.evaluators.get(target)

    def search_budget(self, target: Target) -> Budget:
        """The budget each study of ``target`` searches with: the experiment's, less the confirmation's share of
        its seconds (a replay evaluator never holds time back)."""
        return search_budget(self.exp.budget, self.exp.oracle_options.confirm, self.evaluator(target))

    def claims(self, name: str) -> Claims:
        """The claims of study ``name``: a claim outlives any honest evaluation, a killed worker's lapse at once."""
        lease = 3.0 * self.exp.oracle_options.timeout_s if self.exp.oracle.measures else 120.0
        return make_claims(self.where.url, name, lease)

    # -- baselines and sources ------------------------------------------------------------------------------------
    def baselines(self, target: Target, home: str) -> Baselines | None:
        """On a GPU: the device and the baselines of ``target``'s problem, timed by the same oracle in the same
        worker before the search, or taken from study ``home`` where another worker timed them on a device of
        the same model and versions; read once per problem. None on other oracles."""
        if self.exp.oracle is not OracleKind.GPU:
            return None
        key = target.problem.key
        if key not in self._baselines:
            evaluator = self.evaluator(target)
            claims = make_claims(self.where.url, shared_baselines.baselines_namespace(self.exp.name))
            found = shared_baselines.shared_baselines(self.storage, home, claims,
                                                      self.evaluators.device_info(evaluator),
                                                      lambda: evaluator.baselines(target.problem))
            self._baselines[key] = Baselines(found.baselines, found.device_info, found.describe())
        return self._baselines[key]

    def sources(self, target: Target, strategy: str, options: dict[str, Any]) -> list[Source]:
        """What a strategy that transfers learns from (:func:`transfer_sources`); none for one that does not."""
        return transfer_sources(self.exp, target, self.storage, strategy, options, self.console)

    # -- one study ------------------------------------------------------------------------------------------------
    def tune(self, target: Target, plan: StudyPlan, strategy: Strategy, on_trial: OnTrial | None = None,
             store: StudyStore | None = None) -> TuneResult:
        """Run one study to its plan's budget, its trials shown on the session's live bar; ``store``: the study,
        when the caller opened it already."""
        store = store or StudyStore.open(self.storage, plan.name, target.space, plan.attrs)
        task = None if self.bar is None else self.bar.add_task(plan.label, total=plan.total, best="-")

        def shown(n: int, best: float | None) -> None:
            if self.bar is not None and task is not None:
                self.bar.update(task, completed=n, best=f"{best:.4g} ms" if best is not None else "-")
            if on_trial is not None:
                on_trial(n, best)

        result = tune_study(target.space, target.ctx, self.evaluator(target), strategy, store, plan.budget, shown,
                      claims=plan.claims)
        if store.study.user_attrs.get("stopped") != result.stopped:  # why it stopped, as best reports it
            store.study.set_user_attr("stopped", result.stopped)
        return result

    # -- the confirmation stage ----------------------------------------------------------------------------------
    @contextmanager
    def confirmation_turn(self, group: int, ended: set[str]) -> Iterator[list[StudyStore] | None]:
        """The studies of ``group`` when this worker is to confirm its target, else None
        (:func:`evotune.running.confirmation.confirmation_turn`)."""
        assert self.schedule is not None, "confirmation_turn() is asked inside groups()"
        target = self.targets[group]
        with confirmation_turn(target, self.evaluator(target), self.storage, self.schedule, group, ended,
                               self.exp.budget, self.exp.oracle_options.confirm) as stores:
            yield stores

    def confirm(self, target: Target, measured: list[tuple[float, Point]], config_form: Callable[[Point], Any],
                runs: int | None = None) -> ConfirmationRecord | None:
        """Confirm the fastest of ``measured`` beside the baselines; within the share of ``runs`` runs' seconds
        when given (:func:`evotune.running.confirmation.confirm_best`)."""
        evaluator = self.evaluator(target)
        opts = self.exp.oracle_options.confirm
        seconds = None if runs is None else confirmation_seconds(self.exp.budget, opts, evaluator, runs)
        flush = self.exp.oracle_options.timing.flush if self.exp.oracle is OracleKind.GPU else None
        return confirm_best(target.problem, evaluator, measured, config_form, self.console, opts, seconds, flush)

    def cache_summary(self, target: Target, before: dict[str, int] | None = None) -> str:
        """The compiled-kernel cache's counts so far, or since ``before`` ("" for evaluators without one)."""
        stats = self.evaluator(target).cache_stats
        if not stats:
            return ""
        before = before or {}
        hit, miss, memory = (stats.get(k, 0) - before.get(k, 0) for k in ("hit", "miss", "memory"))
        return f"{hit} hits, {miss} misses, {memory} in memory"


def start_measuring(exp: Experiment, spaces: Iterable[SearchSpace] | None = None) -> bool:
    """On a GPU, start the process the measuring and compile processes fork from (once), importing torch and
    ``spaces``' compilers (seconds), so that its imports run while the caller goes on, then place this process on
    its measuring cores (:mod:`evotune.measurement.host`; the session's end puts it back); whether it runs now.
    Without ``spaces`` (the targets not resolved yet: the GPU's limits not read, the spaces not pruned), the
    experiment's spaces are loaded here, and only a host with an NVIDIA GPU starts it: on a host without one
    resolving refuses the experiment, and nothing should have started. Without torch nothing starts either:
    resolving says what is missing."""
    if exp.oracle is not OracleKind.GPU or importlib.util.find_spec("torch") is None:
        return False
    from evotune.measurement.gpu import start_processes
    from evotune.measurement.host import host_gpus, place_measuring

    if spaces is None:
        if not host_gpus():
            return False
        spaces = [load_space(name, exp.base_dir) for name in exp.spaces]  # the file checked that they load
    # The server first, on every core this process has: its imports (seconds of torch and the spaces' compilers)
    # then run beside this process's own start-up, which goes on on its measuring cores. The GPU workers forked
    # from the server take the CPUs of the process that starts them (processes.as_child): the measuring cores.
    start_processes(spaces)
    place_measuring()
    return True


def make_evaluator(exp: Experiment, target: Target, worker: SpaceWorker | None = None) -> Evaluator:
    """The evaluator of ``target``'s space; ``worker``: a measuring process another space's evaluator started."""
    if exp.oracle is OracleKind.REPLAY:
        assert target.landscape is not None
        return ReplayEvaluator(target.landscape)
    if exp.oracle is OracleKind.CPU:
        from evotune.measurement.cpu import CpuEvaluator

        return CpuEvaluator(target.space, exp.oracle_options, worker=worker)
    return gpu_evaluator_class(exp)(target.space, exp.oracle_options, worker=worker)


class Evaluators:
    """The evaluators of one run, made on first use. One measuring process (a GPU or CPU worker: its start-up,
    its CUDA context) serves every problem and every space of the run, each space's evaluator through a view of
    it (:mod:`evotune.measurement.space_worker`), and its device is read once; so those costs are paid once per
    worker, not once per problem or space. A replay evaluator answers for its one landscape: one per problem
    (they hold nothing but the landscape its target holds)."""

    def __init__(self, exp: Experiment):
        self.exp = exp
        self._open: dict[str, Evaluator] = {}
        self._device: dict[str, Any] | None = None

    def get(self, target: Target) -> Evaluator:
        key = target.problem.key if self.exp.oracle is OracleKind.REPLAY else target.space.name
        if key not in self._open:
            shared = next((ev.shared_worker for ev in self._open.values()), None)
            self._open[key] = make_evaluator(self.exp, target, shared)
        return self._open[key]

    def device_info(self, evaluator: Evaluator) -> dict[str, Any]:
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


def transfer_sources(exp: Experiment, target: Target, storage: optuna.storages.BaseStorage, strategy: str,
                     options: dict[str, Any], console: Console | None = None) -> list[Source]:
    """For a strategy that transfers (unless its options say ``transfer = false``): the experiment's own studies
    of the same space for other problems, and the landscapes and the tuning-result cache its ``sources`` names
    (a landscape of this very problem on this very GPU is left out: it would be the answer); else none. An
    unreadable cache is set aside, and ``console`` told so."""
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
            cache = load_tuned()
            if cache.set_aside is not None and console is not None:
                console.print(f"[yellow]warning:[/] {cache.set_aside}")
            found += from_cache(cache.entries, target.space, target.problem, device)
            continue
        assert isinstance(n, Path)
        if n.resolve() in measured_on:
            continue
        try:
            ls = read_landscape(n)
        except (LandscapeError, OSError) as exc:
            raise ExperimentError(exp.path, "sources", str(exc)) from None
        source = from_landscape(ls, target.problem, device)
        if source.distance > 0 or ls.problem.key != target.problem.key:
            found.append(source)
    return found
