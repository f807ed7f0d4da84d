"""Command line: ``python -m evotune run | worker | record | best | plot | dashboard | spaces | compare | convert |
tune-kernel | export-configs``.

Bad input (an experiment file, a path, a name) ends with one line on stderr
that names the file and the field, and exit code 2. Nothing already finished
is lost: trials are stored as they finish.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, overload

from rich.console import Console
from rich.table import Table

from evotune.experiment import Experiment, ExperimentError, load_experiment
from evotune.schedule import SPLITS
from evotune.storage_url import StorageError

EXIT_USAGE = 2


def _console(stderr: bool = False) -> Console:
    # Rich falls back to 80 columns when output is not a terminal (CI logs, pipes): too narrow for tables.
    out = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if out.isatty() else 130)


class UsageError(Exception):
    """A mistake the user can fix; shown as one line, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args) or 0
    except (ExperimentError, UsageError, StorageError) as exc:
        print(f"evotune: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("evotune: interrupted; finished trials are stored, run the same command again to resume",
              file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evotune", description="Evolutionary autotuner for GPU kernels.")
    sub = p.add_subparsers(metavar="COMMAND")

    run = sub.add_parser("run", help="tune an experiment (resumes if its storage holds trials)")
    run.add_argument("experiment", help="path to an experiment .toml file")
    run.add_argument("--no-progress", action="store_true", help="no live progress bar")
    run.add_argument("--no-plots", action="store_true", help="skip writing PNGs at the end")
    run.set_defaults(func=cmd_run)

    worker = sub.add_parser("worker", help="join the experiment's studies from another process or host")
    worker.add_argument("experiment", help="path to an experiment .toml file (its storage must be shared)")
    worker.add_argument("--no-progress", action="store_true", help="no live progress bar")
    _split_arg(worker)
    worker.add_argument("--costs", metavar="PATH", help="write this worker's measured costs (start-up, per problem, "
                                                        "per evaluation) as JSON")
    worker.set_defaults(func=cmd_worker)

    record = sub.add_parser("record", help="measure every feasible point of the space; write landscape files")
    record.add_argument("experiment", help="path to an experiment .toml file (its strategies are ignored)")
    record.add_argument("--out", help="folder for the landscape files (default runs/landscapes; with "
                                      "--compile-only, runs/compile); the shipped files under "
                                      "experiments/landscapes are rewritten only when --out names their folder")
    record.add_argument("--no-progress", action="store_true", help="no live progress bar")
    record.add_argument("--seconds", type=float, help="stop after this much tuning time (all problems together); "
                                                      "run again to go on where it stopped")
    record.add_argument("--compile-only", action="store_true",
                        help="compile the points for the experiment's hardware (no GPU needed), pruned ones too; "
                             "write what the compiler said, per point")
    record.add_argument("--pruned", metavar="N", help="with --compile-only: compile N pruned points per pruning "
                                                      "constraint (a stratified sample; default: all of them)")
    record.add_argument("--workers", default="2", metavar="W",
                        help="with --compile-only: compile processes (default 2)")
    record.add_argument("--sample", metavar="N", help="record the points the experiment's searches measured and N "
                        "uniformly drawn feasible points, not every one (a space too large to record whole)")
    _split_arg(record)
    record.set_defaults(func=cmd_record)

    plot = sub.add_parser("plot", help="write convergence and parameter-effect PNGs")
    _source_args(plot)
    plot.add_argument("--out", help="output folder (default: the experiment's outputs.plots, or plots/)")
    plot.set_defaults(func=cmd_plot)

    best = sub.add_parser("best", help="print the best configurations and export them as JSON")
    _source_args(best)
    best.add_argument("--json", help="export path (default: the experiment's outputs.best)")
    best.set_defaults(func=cmd_best)

    dash = sub.add_parser("dashboard", help="serve optuna-dashboard for the experiment's storage")
    _source_args(dash)
    dash.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    dash.add_argument("--port", type=int, default=8080)
    dash.set_defaults(func=cmd_dashboard)

    spaces = sub.add_parser("spaces", help="list search spaces with their size and feasible count")
    spaces.add_argument("--hardware", default="H100", help="GPU to prune for: A100, H100, H200, B200 or auto")
    spaces.add_argument("--problem", default="4096x4096x4096", help="MxNxK of the GEMM to prune for")
    spaces.add_argument("--dtype", default="bf16")
    spaces.add_argument("--layout", default="tn")
    spaces.add_argument("--verbose", "-v", action="store_true",
                        help="also list each parameter's choices and how the pruning fared against the compiler")
    spaces.add_argument("--compiled", metavar="DIR", default=None,
                        help="where compile-only files are looked for (default experiments/landscapes/compile)")
    spaces.set_defaults(func=cmd_spaces)

    cmp = sub.add_parser("compare", help="compare strategies on recorded landscapes (in memory, no storage)")
    cmp.add_argument("--landscape", action="append", default=[], metavar="PATH",
                     help="Kernel Tuner cache file or evotune landscape (.json or .json.gz); repeatable")
    cmp.add_argument("--strategy", action="append", default=[], metavar="NAME",
                     help="an evotune strategy, or kt:NAME for Kernel Tuner's (needs pip install '.[bench]'); "
                          "repeatable")
    cmp.add_argument("--budget", action="append", default=[], metavar="N",
                     help="evaluations per run; repeatable (every budget is read off one run per seed)")
    cmp.add_argument("--repeats", default="5", metavar="R", help="runs per strategy, seeds S..S+R-1 (default 5)")
    cmp.add_argument("--seed", default="0", metavar="S", help="first seed (default 0)")
    cmp.add_argument("--out", metavar="DIR", help="where summary.csv, runs.csv, README.md and the plots go")
    cmp.set_defaults(func=cmd_compare)

    conv = sub.add_parser("convert", help="rewrite landscapes (e.g. Kernel Tuner cache files) in evotune's format")
    conv.add_argument("sources", nargs="*", metavar="SRC", help="Kernel Tuner cache file or evotune landscape")
    conv.add_argument("--out", metavar="DIR", help="folder for the converted files, each named SRC's stem + .json.gz")
    conv.add_argument("--samples", default="0", metavar="N",
                      help="timing samples kept per point, spread over their range (default 0: replay reads none)")
    conv.set_defaults(func=cmd_convert)

    tk = sub.add_parser("tune-kernel", help="tune a kernel decorated with evotune.autotune for the keys of a file")
    tk.add_argument("kernel", metavar="MODULE:KERNEL", help="a module (dotted name or .py path) and the kernel in it")
    tk.add_argument("--keys", metavar="KEYS.toml", help="the keys to tune and the module's function that builds "
                                                         "each key's launch (see evotune/autotune/ahead.py)")
    tk.add_argument("--cache", metavar="URL_OR_DIR", help="where decisions are kept (default: the decorator's "
                                                           "cache, else $EVOTUNE_AUTOTUNE_CACHE, else "
                                                           "~/.cache/evotune/autotune)")
    tk.set_defaults(func=cmd_tune_kernel)

    ex = sub.add_parser("export-configs", help="write evotune.autotune's decisions as JSON or vLLM's fused-MoE files")
    ex.add_argument("--cache", metavar="URL_OR_DIR", help="the cache to read (default: $EVOTUNE_AUTOTUNE_CACHE, "
                                                           "else ~/.cache/evotune/autotune)")
    ex.add_argument("--kernel", metavar="NAME", help="only this kernel's decisions")
    ex.add_argument("--format", choices=("json", "vllm-moe"), default="json")
    ex.add_argument("--out", metavar="PATH", help="json: the file (default autotune_configs.json); vllm-moe: the "
                                                  "folder (default .)")
    ex.add_argument("--batch-key", default="M", help="vllm-moe: the key field holding the batch size (default M)")
    ex.add_argument("--experts-key", default="E", help="vllm-moe: the key field holding E (default E)")
    ex.add_argument("--n-key", default="N", help="vllm-moe: the key field holding N (default N)")
    ex.add_argument("--n-divisor", default="1", help="vllm-moe: the file's N is the key's over this (2 for a "
                                                     "kernel keyed by the gate-and-up GEMM's N)")
    ex.set_defaults(func=cmd_export_configs)
    return p


def _split_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", choices=SPLITS, default="problems",
                   help="beside other workers: take whole problems first and share the points of the last ones "
                        "(problems, the default), or share the points of every problem (points)")


def _source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", nargs="?", help="experiment .toml (its storage and name are used)")
    p.add_argument("--storage", help="an Optuna storage URL instead of an experiment file")
    p.add_argument("--name", help="only studies of this experiment name (with --storage)")


def _source(args: argparse.Namespace) -> tuple[str, str | None, Experiment | None]:
    if args.experiment:
        exp = load_experiment(args.experiment)
        return exp.storage, exp.name, exp
    if args.storage:
        return args.storage, args.name, None
    raise UsageError("give an experiment file or --storage URL")


def _open_source(args: argparse.Namespace) -> tuple[Any, str, str | None, Experiment | None]:
    """(the storage, opened to read, its URL, the experiment name, the experiment) of a reading command: the
    storage must exist, and nothing is created to open it."""
    from evotune.study import open_existing

    url, name, exp = _source(args)
    try:
        return open_existing(url), url, name, exp
    except StorageError as exc:
        raise UsageError(f"{args.experiment}: storage.url: {exc}" if exp else f"--storage: {exc}") from None


def cmd_run(args: argparse.Namespace) -> int:
    from evotune.report import best_table, collect_best, export_best
    from evotune.runner import preflight, run_experiment, targets

    exp = load_experiment(args.experiment)
    resolved = targets(exp)
    preflight(exp, resolved)
    console = _console(stderr=True)
    results = run_experiment(exp, console, progress=not args.no_progress, resolved=resolved)
    for r in results:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items()))
        console.print(f"  {r.study_name}: {r.trials} trials ({r.new_trials} new), stopped on {r.stopped}"
                      + (f"; failed: {fails}" if fails else ""))
    rows = collect_best(exp.storage, exp.name)
    _console().print(best_table(rows, f"Best configurations: {exp.name}"))
    console.print(f"best configurations: {export_best(rows, exp.best_path)}")
    _remember(rows, exp.storage, console)
    if not args.no_plots:
        from evotune.plots import plot_experiment  # matplotlib only when plotting

        for path in plot_experiment(exp.storage, exp.name, exp.plots_dir):
            console.print(f"plot: {path}")
    return 0


def _remember(rows: list, storage: str, console: Console) -> None:
    """The results go into the tuning-result cache that evotune.lookup() reads, each with its oracle (gpu, cpu,
    replay), which lookup() selects by."""
    from evotune.lookup import remember

    if rows:
        console.print(f"tuning-result cache: {remember(rows, storage)}")


def cmd_worker(args: argparse.Namespace) -> int:
    """The tuning loop alone: claims problems, studies and points in the shared storage, so any number of
    workers can join."""
    from evotune.cost_model import WorkerCosts
    from evotune.runner import preflight, run_experiment, targets

    costs = WorkerCosts()
    exp = load_experiment(args.experiment)
    resolved = targets(exp)
    preflight(exp, resolved)
    console = _console(stderr=True)
    draw_seed = os.getpid()  # each worker explores its own way; the study stays the one of the seed
    for r in run_experiment(exp, console, progress=not args.no_progress, resolved=resolved, draw_seed=draw_seed,
                            split=args.split, costs=costs, resume_finished=False):
        console.print(f"  {r.study_name}: {r.new_trials} measured by this worker, {r.trials} in the study, "
                      f"stopped on {r.stopped}")
    costs.stop()
    console.print(f"  costs of this worker: {costs.describe()}")
    if args.costs:
        Path(args.costs).write_text(json.dumps(costs.to_dict(), indent=1))
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
    from evotune.record import OUT_DIR, Sampling, record_experiment

    size = _count(args.sample, "--sample", 1)
    for path in record_experiment(exp, Path(args.out) if args.out else OUT_DIR, args.seconds,
                                  _console(stderr=True), args.split, None if size is None else Sampling(size),
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
    from evotune.compile_only import OUT_DIR, CompileOptions, compile_experiment

    opts = CompileOptions(Path(args.out) if args.out else OUT_DIR, workers=_count(args.workers, "--workers", 1),
                          pruned_sample=_count(args.pruned, "--pruned", 0), seconds=args.seconds)
    console = _console(stderr=True)
    for path in compile_experiment(exp, opts, console.print):
        print(path)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from evotune.plots import plot_experiment

    storage, url, name, exp = _open_source(args)
    out = args.out or (exp.plots_dir if exp else "plots")
    paths = plot_experiment(storage, name, out)
    if not paths:
        raise UsageError(f"{args.experiment or url}: no finished trials to plot")
    for path in paths:
        print(path)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    from evotune.report import best_table, collect_best, export_best

    storage, url, name, exp = _open_source(args)
    rows = collect_best(storage, name)
    if not rows:
        raise UsageError(f"{args.experiment or url}: no finished trials yet")
    _console().print(best_table(rows, f"Best configurations: {name or url}"))
    target = args.json or (exp.best_path if exp else None)
    if target:
        print(f"exported: {export_best(rows, target)}")
    _remember(rows, url, _console(stderr=True))
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from evotune.dashboard import DashboardMissing, require_dashboard, serve
    from evotune.storage_url import shown

    try:
        require_dashboard()  # before anything is opened or a URL is printed that would not answer
    except DashboardMissing as exc:
        raise UsageError(str(exc)) from None
    storage, url, _, _ = _open_source(args)
    print(f"optuna-dashboard for {shown(url)} on http://{args.host}:{args.port}/ (Ctrl-C to stop)", flush=True)
    serve(storage, args.host, args.port)
    return 0


def cmd_spaces(args: argparse.Namespace) -> int:
    from evotune import hardware as hw
    from evotune.plugins import builtin_names, entry_point_names, load_space
    from evotune.problem import Problem
    from evotune.space import Context

    try:
        hardware = hw.get_hardware(args.hardware)
    except (hw.UnknownHardware, RuntimeError):
        raise UsageError(f"--hardware: unknown {args.hardware!r}; accepted: auto, {', '.join(hw.names())}") from None
    sizes = args.problem.lower().split("x")
    if len(sizes) != 3 or not all(s.strip().isdigit() and int(s) > 0 for s in sizes):
        raise UsageError(f"--problem: expected MxNxK, three positive integers (e.g. 4096x4096x4096), "
                         f"got {args.problem!r}")
    m, n, k = (int(s) for s in sizes)
    try:
        problem = Problem.gemm(m, n, k, args.dtype, args.layout)
    except ValueError as exc:
        raise UsageError(f"--dtype/--layout: {exc} (expected e.g. bf16, tn)") from None
    table = Table(title=f"Search spaces on {hardware.name} for {problem.describe()}")
    columns = ["space", "size", "feasible", "pruned most by (count x first reason)", "parameters"]
    for col in columns + (["checked against the compiler"] if args.verbose else []):
        table.add_column(col, overflow="fold")
    for name in [*builtin_names(), *entry_point_names()]:
        space = load_space(name)
        # a space of another workload (a convolution) is pruned for its own default problem, and says so
        own = space.workload != problem.kind and space.default_problem is not None
        ctx = Context(hardware, space.default_problem if own else problem)
        assert ctx.problem is not None  # own only for a space with a default problem
        fs = space.feasible(ctx)
        pruned = "; ".join(f"{c} x {fs.reasons[r]}" for r, c in fs.pruned.most_common(2)) or "-"
        params = ", ".join(
            f"{p.name}={list(p.choices)}" if args.verbose else p.name for p in space.params)
        row = [f"{name} (for {ctx.problem.describe()})" if own else name, str(space.size), str(len(fs)), pruned,
               params]
        if args.verbose:
            row.append(_compiler_check(space, ctx, args.compiled))
        table.add_row(*row)
    _console().print(table)
    return 0


def _compiler_check(space: Any, ctx: Any, directory: str | None) -> str:
    """How many feasible points a compile-only file checked, when, and what it found."""
    from evotune.compiled import DEFAULT_DIR, CompiledError, agreement, find_compiled, load_compiled

    path = find_compiled(directory or DEFAULT_DIR, space.name, ctx.hardware.name, ctx.problem.dtype,
                         ctx.problem.layout)
    if path is None:
        return "-"
    try:
        table = load_compiled(path, space)
    except CompiledError as exc:
        raise UsageError(str(exc)) from None
    a = agreement(space, ctx, table)
    builds = sum(a.false_infeasible.values())
    unjudged = sum(a.unjudged.values())
    return (f"{a.checked_feasible} of {a.feasible_total} feasible compiled for {table.meta.get('arch')} on "
            f"{table.meta.get('date')} ({path.name}): {len(a.false_feasible)} false-feasible; "
            f"{a.checked_pruned} pruned compiled, {builds} of them build"
            + (f", {unjudged} pruned for the shape" if unjudged else ""))


def cmd_compare(args: argparse.Namespace) -> int:
    from evotune.compare import KT_CAVEAT, CompareError, compare, make_plan, summary_table

    try:
        plan = make_plan(args.landscape, args.strategy, args.budget, args.repeats, args.seed, args.out)
        result = compare(plan, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    _console().print(summary_table(result.summary))
    if any(name.startswith("kt:") for name in args.strategy):  # the caveat is about Kernel Tuner's strategies
        print(KT_CAVEAT)
    for path in result.files:
        print(path)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from evotune.evaluation.landscape import LandscapeError, convert_files

    if not args.sources:
        raise UsageError("convert: give at least one SRC (a Kernel Tuner cache file or an evotune landscape)")
    if not args.out:
        raise UsageError("--out DIR is required (where the converted landscapes go)")
    try:
        samples = int(args.samples)
    except ValueError:
        samples = -1
    if samples < 0:
        raise UsageError(f"--samples: expected an integer >= 0, got {args.samples!r}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out: {args.out} exists and is not a folder")
    try:
        paths = convert_files(args.sources, args.out, samples)
    except LandscapeError as exc:
        raise UsageError(str(exc)) from None
    for path in paths:
        print(path)
    return 0


def cmd_tune_kernel(args: argparse.Namespace) -> int:
    from evotune.autotune.commands import CommandError, tune_kernel_command

    try:
        return tune_kernel_command(args.kernel, args.keys, args.cache, _console())
    except CommandError as exc:
        raise UsageError(str(exc)) from None


def cmd_export_configs(args: argparse.Namespace) -> int:
    from evotune.autotune.commands import CommandError, export_command

    try:
        return export_command(args.cache, args.kernel, args.format, args.out, args.batch_key, args.experts_key,
                              args.n_key, args.n_divisor)
    except CommandError as exc:
        raise UsageError(str(exc)) from None
