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
from typing import Any

from rich.console import Console

from evotune.core.space import Point
from evotune.running.cost_model import WorkerCosts
from evotune.running.experiment import Experiment, OracleKind
from evotune.running.resume import budget_attr, check_resume, plain
from evotune.running.session import Session, StudyPlan
from evotune.running.targets import Baselines, Target, study_attrs, study_name
from evotune.running.tuner import TuneResult, finished
from evotune.search.strategies import Source, make_strategy
from evotune.storage.claims import Claims, make_claims
from evotune.storage.study import StudyStore


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
    session = Session(exp, console=console, progress=progress, resolved=resolved)
    mark = costs.mark if costs is not None else _no_mark
    mark("experiment read")
    with session:
        mark("storage opened")
        check_resume(exp, session.targets, session.storage, session.console)  # refused before anything is said
        session.console.print(f"[bold]evotune[/] {exp.name}: space {', '.join(exp.spaces)}, oracle {exp.oracle.value}, "
                              f"strategies {', '.join(s.name for s in exp.strategies)}, storage {exp.storage}")
        return _run(session, draw_seed, split, costs, resume_finished)


def _run(session: Session, draw_seed: int, split: str, costs: WorkerCosts | None,
         resume_finished: bool) -> list[TuneResult]:
    exp = session.exp
    runs = [(spec, seed) for spec in exp.strategies for seed in spec.seeds]
    groups = session.tuning_groups()
    of_study = {name: g for g, (_, names) in enumerate(groups) for name in names}
    claims_of: dict[str, Claims] = {}

    def unfinished(name: str) -> bool:
        """Whether study ``name`` wants more points: its budget is not spent, and not held by its workers."""
        t = session.targets[of_study[name]]
        store = StudyStore.load(session.storage, name, t.space)
        if store is None:
            return True
        if finished(store.history(), session.search_budget(t), len(t.space.feasible(t.ctx))):
            return False
        if exp.budget.trials is None:
            return True
        if name not in claims_of:  # asked again on every pass of the schedule: one claims object per study
            claims_of[name] = make_claims(exp.storage, name)
        return claims_of[name].room(exp.budget.trials) > 0

    mark = costs.mark if costs is not None else _no_mark
    results: list[TuneResult] = []
    ended: set[str] = set()
    for g, target, turns in session.groups(groups, unfinished, split, resume_finished):
        began, done = time.perf_counter(), len(results)
        before = dict(session.evaluator(target).cache_stats)
        mark("first problem taken up")
        if session.exp.oracle is OracleKind.GPU:
            # read once and kept: the measuring process is up and has seen its device
            session.evaluators.device_info(session.evaluator(target))
            mark("device read")
        baselines = session.baselines(target, groups[g][1][0])
        mark("first baselines")
        sources: dict[str, list[Source]] = {}  # the other problems' studies stay as they are meanwhile
        for turn in turns:
            spec, seed = runs[turn.study]
            if spec.name not in sources:
                sources[spec.name] = session.sources(target, spec.name, spec.options)
                mark("first sources read")
            results.append(_run_one(session, target, spec.name, seed, spec.options, baselines,
                                    0 if turn.whole else draw_seed, sources[spec.name]))
            ended.add(results[-1].study_name)
        with session.confirmation_turn(g, ended) as stores:
            if stores:
                _confirm(session, target, stores)
        summary = session.cache_summary(target, before)
        if summary:
            session.console.print(f"  compiled-kernel cache for {target.problem.key}: {summary}")
        if costs is not None:
            costs.took(time.perf_counter() - began, results[done:])
    return results


def _no_mark(step: str) -> None:
    """No costs kept: a start-up step goes unnoted."""


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
