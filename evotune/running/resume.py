"""Resuming a study from an experiment file that has changed since the study began: said before any trial.

A study keeps the strategy options and the budget it was run with (its
``options`` and ``budget`` attributes, written by :mod:`evotune.running.run`). On
resume:

* a changed strategy option is refused (:class:`ExperimentError`: one line,
  exit code 2, nothing measured): the study's trials came from one search,
  and carrying on with another would mix two searches under one name;
* a budget lower than the one the study began with is said in a warning, and
  so is a study that already holds more than a budget other than its own: it
  is past it and is not resumed (a budget is where a study stops, so lowering
  it loses nothing measured). A study resumed with the budget it ran to is
  said nothing of, finished or not;
* a GPU study measured after another L2 flush (``oracle.flush``; one that
  names none had "dirty") is refused the same way: its times and the new
  ones would not compare.

Studies made before these attributes were stored are compared on what they
hold (their trials and tuning clock) only.
"""

from __future__ import annotations

import json
from typing import Any

import optuna
from rich.console import Console

from evotune.core.budget import Budget
from evotune.core.flush import UNRECORDED_FLUSH
from evotune.running.experiment import Experiment, ExperimentError, OracleKind, StrategySpec
from evotune.running.targets import Target, study_name
from evotune.storage.study import StudyStore

UNSET = object()


def plain(value: Any) -> Any:
    """``value`` as a study attribute holds it (JSON: tuples become lists)."""
    return json.loads(json.dumps(value, default=str))


def budget_attr(budget: Budget) -> dict[str, Any]:
    """The ``budget`` attribute a study keeps."""
    return {"trials": budget.trials, "seconds": budget.seconds, "plateau": budget.plateau}


def check_resume(exp: Experiment, resolved: list[Target], storage: optuna.storages.BaseStorage,
                 console: Console) -> None:
    """Refuse a changed strategy option of a study that exists; warn of a budget lowered below it."""
    for target in resolved:
        for spec in exp.strategies:
            for seed in spec.seeds:
                name = study_name(exp, target, spec.name, seed)
                store = StudyStore.load(storage, name, target.space)
                if store is not None:
                    _check_options(exp, spec, name, store.study.user_attrs)
                    _check_flush(exp, name, store.study.user_attrs)
                    _check_budget(exp, name, store, console)


def _show(options: dict[str, Any], key: str) -> str:
    value = options.get(key, UNSET)
    return "unset (the strategy's default)" if value is UNSET else f"{key} = {value!r}"


def _check_options(exp: Experiment, spec: StrategySpec, name: str, attrs: dict[str, Any]) -> None:
    stored = attrs.get("options")
    if not isinstance(stored, dict):
        return
    new = plain(spec.options)
    for key in sorted(set(stored) | set(new)):
        if stored.get(key, UNSET) != new.get(key, UNSET):
            raise ExperimentError(exp.path, f"{spec.where}.options.{key}",
                                  f"study {name} was run with {_show(stored, key)}, this file has "
                                  f"{_show(new, key)}: resuming it would mix two searches (restore the option, "
                                  "or give the experiment another name)")


def _check_flush(exp: Experiment, name: str, attrs: dict[str, Any]) -> None:
    """Refuse to resume a GPU study measured after another L2 flush (one that names none had the only one)."""
    if exp.oracle is not OracleKind.GPU or attrs.get("oracle") != OracleKind.GPU.value:
        return
    stored, new = attrs.get("flush", UNRECORDED_FLUSH), exp.oracle_options.timing.flush
    if stored != new:
        raise ExperimentError(exp.path, "oracle.flush", f"study {name} was measured after the {stored!r} flush, "
                                                        f"this file has {new!r}: resuming it would mix two flushes "
                                                        "(restore it, or give the experiment another name)")


def _check_budget(exp: Experiment, name: str, store: StudyStore, console: Console) -> None:
    stored = store.study.user_attrs.get("budget")
    stored = stored if isinstance(stored, dict) else {}
    new = budget_attr(exp.budget)
    history = None
    for key, unit in (("trials", ""), ("seconds", " s")):
        old, now = stored.get(key), new[key]
        if now is None:
            continue
        if history is None:
            history = store.history()
        held = len(history) if key == "trials" else max((r.clock_s for r in history), default=0.0)
        lowered = old is not None and now < old
        # a study run to this very budget holds it (a clock a little past it): done, and nothing to say
        beyond = held > now and (old is None or now != old)
        if not (lowered or beyond):
            continue
        said = f"study {name} began with {old:g}{unit}, now {now:g}{unit}" if lowered else f"study {name}"
        if held >= now:
            said += (f"; it holds {held:g}{unit}{' trials' if key == 'trials' else ' of tuning clock'}, "
                     "already past it: nothing more is measured")
        console.print(f"[yellow]warning:[/] {exp.path}: budget.{key}: {said}")
