"""``evotune run`` and ``evotune worker``: tune every (problem, space, strategy, seed) to its budget.

A policy over the :class:`~evotune.running.session.Session`: each study searches with the experiment's budget
(less the confirmation's share of its seconds), its strategy transferring from related results; after a group, the
worker that finished its last study confirms its best configurations beside the baselines.

Several processes (``evotune worker``) may run one experiment together: which
studies each takes up, alone or beside the others, is :mod:`evotune.running.schedule`'s
choice, and every point is claimed before it is measured (:mod:`evotune.storage.claims`).

Example::

    from evotune.running.experiment import load_experiment
    from evotune.running.run import run_experiment
    results = run_experiment(load_experiment("experiments/quickstart.toml"))
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from evotune.core.space import Point
from evotune.running.cost_model import WorkerCosts
from evotune.running.experiment import Experiment, OracleKind
from evotune.running.resume import budget_attr, check_resume, plain
from evotune.running.session import Groups, Session, StudyPlan, StudyStorage
from evotune.running.study_progress import TuneResult, finished
from evotune.running.targets import Baselines, Target, group_name, study_attrs, study_name, target_study_names
from evotune.search.strategies import Source, make_strategy
from evotune.storage.claims import Claims, make_claims
from evotune.storage.study import StudyStore


@dataclass(frozen=True)
class Role:
    """How this process takes part in the experiment beside other workers: ``split``, what it takes up (see
    :mod:`evotune.running.schedule`); ``draw_seed``, what a study it shares draws its proposals from on top of
    its seed (one it runs alone proposes as a lone run would); ``resume_finished``: whether a study whose budget
    is spent is resumed (not by a worker that joins late); ``costs``: told each problem's time and where its
    start-up goes. The default is a lone ``run``."""

    split: str = "problems"
    draw_seed: int = 0
    resume_finished: bool = True
    costs: WorkerCosts | None = None

    def mark(self, step: str) -> None:
        """Start-up step ``step`` ended now (noted where costs are kept)."""
        if self.costs is not None:
            self.costs.mark(step)


def run_experiment(exp: Experiment, console: Console | None = None, progress: bool = True,
                   role: Role | None = None) -> list[TuneResult]:
    """Tune every (problem, strategy, seed) of ``exp`` to its budget; resumes what the storage already holds.

    Everything that can be wrong with the experiment is checked before the
    storage is opened, so a bad file leaves nothing behind. ``role``: how this worker takes part beside others
    (:class:`Role`; default, alone).
    """
    role = role or Role()
    session = Session(exp, StudyStorage.tuning(exp), console=console, progress=progress)
    role.mark("experiment read")
    with session:
        role.mark("storage opened")
        check_resume(exp, session.targets, session.storage, session.console)  # refused before anything is said
        session.console.print(f"[bold]evotune[/] {exp.name}: space {', '.join(exp.spaces)}, oracle "
                              f"{exp.oracle.value}, strategies {', '.join(s.name for s in exp.strategies)}, "
                              f"storage {exp.storage}")
        return _run(session, role)


def tuning_groups(exp: Experiment, targets: list[Target]) -> Groups:
    """Each target's group and its studies, one per (strategy, seed)."""
    return [(group_name(exp, t), target_study_names(exp, t)) for t in targets]


def _run(session: Session, role: Role) -> list[TuneResult]:
    exp = session.exp
    runs = [(spec, seed) for spec in exp.strategies for seed in spec.seeds]
    groups = tuning_groups(exp, session.targets)
    claims_of: dict[str, Claims] = {}

    def wants_more(target: Target, store: StudyStore) -> bool:
        """Whether the study wants more points: its budget is not spent, and not held by its workers."""
        if finished(store.history(), session.search_budget(target), len(target.space.feasible(target.ctx))):
            return False
        if exp.budget.trials is None:
            return True
        name = store.study.study_name
        if name not in claims_of:  # asked again on every pass of the schedule: one claims object per study
            claims_of[name] = make_claims(exp.storage, name)
        return claims_of[name].room(exp.budget.trials) > 0

    results: list[TuneResult] = []
    ended: set[str] = set()
    for g, target, turns in session.groups(groups, wants_more, role.split, role.resume_finished):
        began, done = time.perf_counter(), len(results)
        before = dict(session.evaluator(target).cache_stats)
        role.mark("first problem taken up")
        if exp.oracle is OracleKind.GPU:
            # read once and kept: the measuring process is up and has seen its device
            session.evaluators.device_info(session.evaluator(target))
            role.mark("device read")
        baselines = session.baselines(target, groups[g][1][0])
        role.mark("first baselines")
        sources: dict[str, list[Source]] = {}  # the other problems' studies stay as they are meanwhile
        for turn in turns:
            spec, seed = runs[turn.study]
            if spec.name not in sources:
                sources[spec.name] = session.sources(target, spec.name, spec.options)
                role.mark("first sources read")
            results.append(_run_one(session, target, spec.name, seed, spec.options, baselines,
                                    0 if turn.whole else role.draw_seed, sources[spec.name]))
            ended.add(results[-1].study_name)
        with session.confirmation_turn(g, ended) as stores:
            if stores:
                _confirm(session, target, stores)
        summary = session.cache_summary(target, before)
        if summary:
            session.console.print(f"  compiled-kernel cache for {target.problem.key}: {summary}")
        if role.costs is not None:
            role.costs.took(time.perf_counter() - began, results[done:])
    return results


def _run_one(session: Session, target: Target, strategy: str, seed: int, options: dict[str, Any],
             baselines: Baselines | None, draw_seed: int, sources: list[Source]) -> TuneResult:
    exp = session.exp
    name = study_name(exp, target, strategy, seed)
    attrs = study_attrs(exp, target, strategy, seed, baselines)
    attrs.update(options=plain(options), budget=budget_attr(exp.budget))  # what a resume is checked against
    if sources:
        attrs["transfer_sources"] = [{"name": s.name, "distance": round(s.distance, 3)} for s in sources]
    feasible = target.space.feasible(target.ctx)
    # The study is named by `seed`; a worker that joins it draws its proposals from `draw_seed` on top,
    # so that workers do not all propose the same points (and lose them to each other's claims).
    strat = make_strategy(strategy, target.space, feasible, seed=seed + draw_seed, ctx=target.ctx, sources=sources,
                          **options)
    total = min(exp.budget.trials, len(feasible)) if exp.budget.trials else None
    label = f"{target.problem.key[:28]} {target.space.name[:18]} {strategy} s{seed}"
    plan = StudyPlan(name, attrs, session.search_budget(target), session.claims(name), label, total)
    return session.tune(target, plan, strat)


def _confirm(session: Session, target: Target, stores: list[StudyStore]) -> None:
    """The confirmation stage for one problem and space: its best configurations over ``stores`` (every study of
    the experiment for it), re-timed beside the baselines within the runs' share of their seconds; the record is
    kept in each of those studies."""
    best: dict[str, tuple[float, Point]] = {}
    for store in stores:
        for r in store.history():
            if r.value is not None and (r.key not in best or r.value < best[r.key][0]):
                best[r.key] = (r.value, r.point)
    record = session.confirm(target, list(best.values()), target.space.to_storage, runs=len(stores))
    if record is None:
        return
    for store in stores:
        store.study.set_user_attr("confirmation", record.to_attr())
