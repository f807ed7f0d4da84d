"""A target (one problem in one space, with its context) and the names and attributes of its studies.

Each (problem, space, strategy, seed) of an experiment is one study named
``EXPERIMENT/PROBLEM/SPACE/STRATEGY/seedN``; the studies of one target form its
group, ``EXPERIMENT/PROBLEM/SPACE``, which is what a worker takes up as a whole
(:mod:`evotune.schedule`) and what the confirmation stage confirms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evotune.evaluation.landscape import Landscape
from evotune.experiment import Experiment
from evotune.problem import Problem
from evotune.space import Context, SearchSpace


@dataclass
class Target:
    """One problem to tune, with its space, context and (for replay) landscape."""

    problem: Problem
    space: SearchSpace
    ctx: Context
    landscape: Landscape | None = None
    baselines: dict = field(default_factory=dict)  # name -> timing, measured beside the candidates
    device: dict = field(default_factory=dict)  # what the numbers depend on: device, clocks, versions
    baselines_by: str = ""  # the worker that timed the baselines, its device and when


def group_name(exp: Experiment, target: Target) -> str:
    """``EXPERIMENT/PROBLEM/SPACE``: the studies of one target."""
    return f"{exp.name}/{target.problem.key}/{target.space.name}"


def study_name(exp: Experiment, target: Target, strategy: str, seed: int | None = None) -> str:
    """``EXPERIMENT/PROBLEM/SPACE/STRATEGY/seedN``: one study per run."""
    tail = f"/seed{seed}" if seed is not None else ""
    return f"{group_name(exp, target)}/{strategy}{tail}"


def study_names(exp: Experiment, target: Target) -> list[str]:
    """Every study of ``target``, in the order of the experiment's strategies and seeds."""
    return [study_name(exp, target, spec.name, seed) for spec in exp.strategies for seed in spec.seeds]


def study_attrs(exp: Experiment, target: Target, strategy: str, seed: int) -> dict:
    attrs = {
        "experiment": exp.name, "space": target.space.name, "problem": target.problem.to_dict(),
        # how the space is loaded again (a built-in's name, a user's file path): compile_best() needs it
        "space_source": target.space.source or target.space.name,
        "problem_key": target.problem.key, "strategy": strategy, "seed": seed, "oracle": exp.oracle,
        "hardware": target.ctx.hardware.name if target.ctx.hardware else None,
        "feasible": len(target.space.feasible(target.ctx)), "space_size": target.space.size,
    }
    if exp.oracle == "gpu":
        attrs["flush"] = exp.oracle_options.timing.flush  # the L2 flush before each sample
    if target.landscape is not None:
        ls = target.landscape
        attrs.update(landscape=str(ls.path), optimum_ms=ls.optimum_ms, device=ls.meta.get("device"),
                     baselines=ls.baselines)
        if ls.flush is not None:  # the recorded flush; one the file does not name reads as the only one then
            attrs["flush"], attrs["flush_recorded"] = ls.flush
    if target.device:
        attrs.update(device=target.device.get("device"), device_info=target.device)
    if target.baselines:
        attrs["baselines"] = target.baselines
    if target.baselines_by:
        attrs["baselines_by"] = target.baselines_by
    return attrs
