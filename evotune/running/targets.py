"""What a run is about: its targets (one problem in one space, with its context), resolved and checked once, and
the names and attributes of their studies.

:func:`resolve_targets` reads the experiment's problems, spaces, hardware and landscapes into :class:`Target` s and
checks everything that can be wrong before any storage is touched: the hardware, each landscape, the space's workload
and feasible points, the machine's compiler (``SearchSpace.needs``), each strategy's options.

Each (problem, space, strategy, seed) of an experiment is one study named
``EXPERIMENT/PROBLEM/SPACE/STRATEGY/seedN``; the studies of one target form its
group, ``EXPERIMENT/PROBLEM/SPACE``, which is what a worker takes up as a whole
(:mod:`evotune.running.schedule`) and what the confirmation stage confirms.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from evotune.core import hardware as hw
from evotune.core.compile_results import CompiledError, compiled_context
from evotune.core.landscape import Landscape, LandscapeError, load_landscape
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.space import Context, SearchSpace
from evotune.running.experiment import Experiment, ExperimentError, OracleKind
from evotune.search.strategies import make_strategy

if TYPE_CHECKING:  # imported where a run measures on a GPU
    from evotune.measurement.gpu import GpuEvaluator

NO_TORCH = ("'gpu' needs the gpu extra and a CUDA GPU (torch is not installed: pip install '.[gpu]' in the evotune "
            "clone)")


@dataclass(frozen=True)
class Target:
    """One problem to tune, with its space, context and (for replay) landscape."""

    problem: Problem
    space: SearchSpace
    ctx: Context
    landscape: Landscape | None = None


@dataclass(frozen=True)
class Baselines:
    """A problem's baselines, timed beside the candidates by one worker (:mod:`evotune.running.shared_baselines`),
    with what the numbers depend on (device, clocks, versions) and who timed them when."""

    timings: dict[str, Any]  # name -> timing
    device: dict[str, Any]
    by: str = ""


def targets(exp: Experiment) -> list[Target]:
    """Resolve the experiment's problems, spaces and hardware; every error names its field."""
    hardware = None
    if exp.hardware is not None:
        try:
            hardware = hw.get_hardware(exp.hardware)
        except RuntimeError as exc:
            raise ExperimentError(exp.path, "hardware", f"'auto' found no GPU ({exc})") from None
        fp8 = [p for p in exp.problems if p.dtype == "fp8"]
        if fp8 and not hardware.has("fp8"):  # a table entry's name was checked with the problems
            raise ExperimentError(exp.path, "hardware", f"{exp.hardware!r} is {hardware.name} ({hardware.arch}), "
                                  f"without the FP8 tensor cores (sm_89 and newer) that {fp8[0].describe()} needs")
    out = []
    if exp.oracle is OracleKind.REPLAY:
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
        try:
            out = [replace(t, ctx=compiled_context(exp.compiled_dir, t.space, t.ctx)) for t in out]
        except CompiledError as exc:
            raise ExperimentError(exp.path, "compiled", str(exc)) from None
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


def resolve_targets(exp: Experiment, measuring: bool = True) -> list[Target]:
    """The experiment's targets (:func:`targets`), checked before any storage is touched: every error names its
    field. A space whose compiler or DSL this machine lacks (``SearchSpace.needs``) is refused in one line, else
    every point would be compiled, fail the same way and be stored as failed. With ``measuring``, also what the
    evaluator needs, and each strategy built once, so that a bad option fails now."""
    resolved = targets(exp)
    if measuring and exp.oracle is OracleKind.GPU and importlib.util.find_spec("torch") is None:
        raise ExperimentError(exp.path, "oracle.kind", NO_TORCH)
    for space in {t.space.name: t.space for t in resolved}.values() if exp.oracle.measures else ():
        missing = space.needs.missing()
        if missing:
            raise ExperimentError(exp.path, "space", f"{space.name!r} cannot compile on this machine, which "
                                  f"lacks {' and '.join(missing)}")
    for target in resolved if measuring else ():
        if exp.oracle.measures and target.space.build is None:
            # the CPU and GPU evaluators build every point with it, in a worker that loads the space by source
            raise ExperimentError(exp.path, "space", f"{target.space.source or target.space.name} defines SPACE "
                                  f"without build(point, problem), which oracle.kind = {exp.oracle.value!r} needs to "
                                  "run a point")
        for spec in exp.strategies:
            try:
                make_strategy(spec.name, target.space, target.space.feasible(target.ctx), seed=spec.seed,
                              ctx=target.ctx, **spec.options)
            except ValueError as exc:
                raise ExperimentError(exp.path, f"{spec.where}.options", str(exc)) from None
    return resolved


def gpu_evaluator_class(exp: Experiment) -> type[GpuEvaluator]:
    # The GPU worker imports torch in its own process; without it every point would fail there, one by one.
    if importlib.util.find_spec("torch") is None:
        raise ExperimentError(exp.path, "oracle.kind", NO_TORCH)
    from evotune.measurement.gpu import GpuEvaluator

    return GpuEvaluator


def group_name(exp: Experiment, target: Target) -> str:
    """``EXPERIMENT/PROBLEM/SPACE``: the studies of one target."""
    return f"{exp.name}/{target.problem.key}/{target.space.name}"


def study_name(exp: Experiment, target: Target, strategy: str, seed: int | None = None) -> str:
    """``EXPERIMENT/PROBLEM/SPACE/STRATEGY/seedN``: one study per run."""
    tail = f"/seed{seed}" if seed is not None else ""
    return f"{group_name(exp, target)}/{strategy}{tail}"


def target_study_names(exp: Experiment, target: Target) -> list[str]:
    """Every study of ``target``, in the order of the experiment's strategies and seeds."""
    return [study_name(exp, target, spec.name, seed) for spec in exp.strategies for seed in spec.seeds]


def study_attrs(exp: Experiment, target: Target, strategy: str, seed: int,
                baselines: Baselines | None = None) -> dict[str, Any]:
    attrs = {
        "experiment": exp.name, "space": target.space.name, "problem": target.problem.to_dict(),
        # how the space is loaded again (a built-in's name, a user's file path): compile_best() needs it
        "space_source": target.space.source or target.space.name,
        "problem_key": target.problem.key, "strategy": strategy, "seed": seed, "oracle": exp.oracle.value,
        "hardware": target.ctx.hardware.name if target.ctx.hardware else None,
        "feasible": len(target.space.feasible(target.ctx)), "space_size": target.space.size,
    }
    if exp.oracle is OracleKind.GPU:
        attrs["flush"] = exp.oracle_options.timing.flush  # the L2 flush before each sample
    if target.landscape is not None:
        ls = target.landscape
        attrs.update(landscape=str(ls.path), optimum_ms=ls.optimum_ms, device=ls.meta.get("device"),
                     baselines=ls.baselines)
        if ls.flush is not None:  # the recorded flush; one the file does not name reads as the only one then
            attrs["flush"], attrs["flush_recorded"] = ls.flush
    if baselines is not None:
        if baselines.device:
            attrs.update(device=baselines.device.get("device"), device_info=baselines.device)
        if baselines.timings:
            attrs["baselines"] = baselines.timings
        if baselines.by:
            attrs["baselines_by"] = baselines.by
    return attrs
