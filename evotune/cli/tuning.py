"""The commands that measure: ``run``, ``worker``, ``record`` and ``record --compile-only``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import overload

from evotune.cli.output import UsageError, add_to_tuned_cache, make_console
from evotune.running.experiment import Experiment, load_experiment


def cmd_run(args: argparse.Namespace) -> int:
    from evotune.reporting.report import best_table, collect_best, export_best
    from evotune.running.run import run_experiment

    exp = load_experiment(args.experiment)
    exp.check_outputs(plots=not args.no_plots)  # written at the end: found unusable now, before the run
    console = make_console(stderr=True)
    results = run_experiment(exp, console, progress=not args.no_progress)
    for r in results:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items()))
        console.print(f"  {r.study_name}: {r.trials} trials ({r.new_trials} new), {r.stop_text}"
                      + (f"; failed: {fails}" if fails else ""))
    rows = collect_best(exp.storage, exp.name)
    make_console().print(best_table(rows, f"Best configurations: {exp.name}"))
    console.print(f"best configurations: {export_best(rows, exp.best_path)}")
    add_to_tuned_cache(rows, exp.storage, console)
    if not args.no_plots:
        from evotune.reporting.plots import plot_experiment  # matplotlib only when plotting

        for path in plot_experiment(exp.storage, exp.name, exp.plots_dir):
            console.print(f"plot: {path}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """The tuning loop alone: claims problems, studies and points in the shared storage, so any number of
    workers can join."""
    from evotune.running.cost_model import WorkerCosts
    from evotune.running.run import Role, run_experiment

    costs = WorkerCosts()
    exp = load_experiment(args.experiment)
    console = make_console(stderr=True)
    # each worker explores its own way (its pid drawn on top of a shared study's seed); the study stays the one of
    # the seed; a study whose budget is spent is not resumed by a worker that joins late
    role = Role(args.split, draw_seed=os.getpid(), resume_finished=False, costs=costs)
    for r in run_experiment(exp, console, progress=not args.no_progress, role=role):
        console.print(f"  {r.study_name}: {r.new_trials} measured by this worker, {r.trials} in the study, "
                      f"{r.stop_text}")
    costs.stop()
    console.print(f"  costs of this worker: {costs.describe()}")
    if args.costs:
        path = Path(args.costs)
        path.parent.mkdir(parents=True, exist_ok=True)  # e.g. runs/ on a host whose storage is a server
        path.write_text(json.dumps(costs.to_dict(), indent=1))
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    exp = load_experiment(args.experiment)
    if args.seconds is not None and args.seconds <= 0:
        raise UsageError(f"--seconds: must be positive, got {args.seconds}")
    if args.compile_only:
        if args.sample is not None:
            raise UsageError("--sample: not with --compile-only")
        return _compile_only(args, exp)
    if args.pruned is not None:
        raise UsageError("--pruned: only with --compile-only")
    from evotune.running.record import OUT_DIR, Sampling, record_experiment

    size = _count(args.sample, "--sample", 1)
    for path in record_experiment(exp, Path(args.out) if args.out else OUT_DIR, args.seconds,
                                  make_console(stderr=True), args.split, None if size is None else Sampling(size),
                                  progress=not args.no_progress):
        print(path)
    return 0


@overload
def _count(value: str, flag: str, low: int) -> int: ...
@overload
def _count(value: str | None, flag: str, low: int) -> int | None: ...
def _count(value: str | None, flag: str, low: int) -> int | None:
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        n = low - 1
    if n < low:
        raise UsageError(f"{flag}: expected an integer >= {low}, got {value!r}")
    return n


def _compile_only(args: argparse.Namespace, exp: Experiment) -> int:
    from evotune.running.compile_only import OUT_DIR, CompileOptions, compile_experiment

    opts = CompileOptions(Path(args.out) if args.out else OUT_DIR, workers=_count(args.workers, "--workers", 1),
                          pruned_sample=_count(args.pruned, "--pruned", 0), seconds=args.seconds)
    console = make_console(stderr=True)
    for path in compile_experiment(exp, opts, console.print):
        print(path)
    return 0


