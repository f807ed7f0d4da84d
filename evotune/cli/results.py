"""The commands that read: ``plot``, ``best``, ``dashboard``, ``spaces``, ``compare``, ``convert``."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from evotune.cli.output import UsageError, add_to_tuned_cache, make_console
from evotune.running.experiment import PLOTS_DIR, Experiment, load_experiment, unwritable
from evotune.storage.url import StorageError


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
    from evotune.storage.study import open_existing

    url, name, exp = _source(args)
    try:
        return open_existing(url), url, name, exp
    except StorageError as exc:
        raise UsageError(f"{args.experiment}: storage.url: {exc}" if exp else f"--storage: {exc}") from None


def _check_output(exp: Experiment | None, given: str | None, flag: str, best: bool) -> None:
    """Refuse an output the command cannot write (``given`` with ``flag``, else the experiment's own) before
    anything is read."""
    if given is not None:
        why = unwritable(Path(given), folder=not best)
        if why:
            raise UsageError(f"{flag}: {why}")
    elif exp is not None:
        exp.check_outputs(best=best, plots=not best)


def cmd_plot(args: argparse.Namespace) -> int:
    from evotune.reporting.plots import plot_experiment

    storage, url, name, exp = _open_source(args)
    _check_output(exp, args.out, "--out", best=False)
    out = args.out or (exp.plots_dir if exp else PLOTS_DIR)
    paths = plot_experiment(storage, name, out)
    if not paths:
        raise UsageError(f"{args.experiment or url}: no finished trials to plot")
    for path in paths:
        print(path)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    from evotune.reporting.report import best_table, collect_best, export_best

    storage, url, name, exp = _open_source(args)
    _check_output(exp, args.json, "--json", best=True)
    rows = collect_best(storage, name)
    if not rows:
        raise UsageError(f"{args.experiment or url}: no finished trials yet")
    make_console().print(best_table(rows, f"Best configurations: {name or url}"))
    target = args.json or (exp.best_path if exp else None)
    if target:
        print(f"exported: {export_best(rows, target)}")
    add_to_tuned_cache(rows, url, make_console(stderr=True))
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from evotune.reporting.dashboard import DashboardAddressError, DashboardMissing, listen, require_dashboard
    from evotune.storage.url import shown

    try:
        require_dashboard()  # before anything is opened or a URL is printed that would not answer
    except DashboardMissing as exc:
        raise UsageError(str(exc)) from None
    storage, url, _, _ = _open_source(args)
    try:
        server = listen(storage, args.host, args.port)  # bound before the address is announced
    except DashboardAddressError as exc:
        raise UsageError(str(exc)) from None
    with server:
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"optuna-dashboard for {shown(url)} on http://{host}:{args.port}/ (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:  # the way to stop it: nothing was interrupted
            pass
    return 0


def cmd_spaces(args: argparse.Namespace) -> int:
    from evotune.core import hardware as hw
    from evotune.core.plugins import builtin_names, entry_point_names, load_space
    from evotune.core.problem import Problem
    from evotune.core.space import Context

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
        problem = Problem.gemm(m, n, k, args.dtype, args.layout, args.scaling)
    except ValueError as exc:
        raise UsageError(f"--dtype/--layout/--scaling: {exc} (expected e.g. bf16, tn; fp8 with tensor, row or "
                         "block)") from None
    if problem.dtype == "fp8" and not hardware.has("fp8"):  # as an experiment's problems are refused
        raise UsageError(f"--hardware/--dtype: fp8 needs FP8 tensor cores (sm_89 and newer); {hardware.name} "
                         f"({hardware.arch}) has none")
    rows = []
    for name in [*builtin_names(), *entry_point_names()]:
        space = load_space(name)
        # a space of another workload (a convolution) is pruned for its own default problem, and says so
        own = space.workload != problem.kind and space.default_problem is not None
        ctx = Context(hardware, space.default_problem if own else problem)
        assert ctx.problem is not None  # own only for a space with a default problem
        fs = space.feasible(ctx)
        rows.append(SpaceRow(
            name, ctx.problem.describe() if own else None, space.description if args.verbose else "",
            space.size, len(fs), "; ".join(f"{c} x {fs.reasons[r]}" for r, c in fs.pruned.most_common(2)) or "-",
            ", ".join(f"{p.name}={list(p.choices)}" if args.verbose else p.name for p in space.params),
            _compiler_check(space, ctx, args.compiled) if args.verbose else None))
    console = make_console()
    title = f"Search spaces on {hardware.name} for {problem.describe()}"
    if console.width >= WIDE_TABLE:
        console.print(_spaces_table(rows, title, args.verbose))
    else:
        _print_spaces_narrow(console, rows, title)
    return 0


@dataclass
class SpaceRow:
    """One space of ``spaces``: its name, the problem it was pruned for when not the one asked (a space of another
    workload), what it is (with -v), its size and feasible count, its two most pruning constraints, its
    parameters and (with -v) how the pruning fared against the compiler."""

    name: str
    own_problem: str | None
    description: str
    size: int
    feasible: int
    pruned: str
    params: str
    compiler: str | None


WIDE_TABLE = 120  # narrower than this, each space is a few wrapped lines: a table's columns would split its names


def _spaces_table(rows: list[SpaceRow], title: str, verbose: bool) -> Table:
    table = Table(title=title)
    columns = ["space", "size", "feasible", "pruned most by (count x first reason)", "parameters"]
    for col in columns + (["checked against the compiler"] if verbose else []):
        table.add_column(col, overflow="fold")
    for r in rows:
        label = r.name + (f" (for {r.own_problem})" if r.own_problem else "") + \
            (f": {r.description}" if r.description else "")
        table.add_row(label, str(r.size), str(r.feasible), r.pruned, r.params,
                      *([r.compiler or "-"] if verbose else []))
    return table


def _print_spaces_narrow(console: Console, rows: list[SpaceRow], title: str) -> None:
    """Each space as a line of its name and counts, then its details indented; lines wrap at word boundaries,
    their continuations indented further."""

    def lines(text: str, indent: int) -> list[str]:
        return textwrap.wrap(text, width=console.width, initial_indent=" " * indent,
                             subsequent_indent=" " * (indent + 4), break_long_words=False, break_on_hyphens=False)

    console.print(Text(title, style="bold"), soft_wrap=True)
    for r in rows:
        head = lines(r.name + (f" (for {r.own_problem})" if r.own_problem else "")
                     + f": {r.size} points, {r.feasible} feasible", 0)
        first = Text(head[0])
        first.stylize("bold", 0, len(r.name))
        console.print(first, soft_wrap=True)
        details = ([r.description] if r.description else []) + [f"pruned most by {r.pruned}",
                                                                  f"parameters: {r.params}"]
        if r.compiler is not None:
            details.append(f"checked against the compiler: {r.compiler}")
        for line in head[1:] + [ln for d in details for ln in lines(d, 2)]:
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _compiler_check(space: Any, ctx: Any, directory: str | None) -> str:
    """How many feasible points a compile-only file checked, when, and what it found."""
    from evotune.core.compile_results import DEFAULT_DIR, CompiledError, agreement, find_compiled, load_compiled

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
    from evotune.reporting.compare import KT_CAVEAT, CompareError, compare, make_compare_plan, summary_table

    try:
        plan = make_compare_plan(args.landscape, args.strategy, args.budget, args.repeats, args.seed, args.out)
        result = compare(plan, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    make_console().print(summary_table(result.summary))
    if any(name.startswith("kt:") for name in args.strategy):  # the caveat is about Kernel Tuner's strategies
        print(KT_CAVEAT)
    for path in result.files:
        print(path)
    return 0


def _digits(flag: str, value: str | None) -> int | None:
    """A ``--*-digits`` option's value: None when not given, else 1 to 17."""
    from evotune.core.landscape_convert import EXACT_DIGITS

    if value is None:
        return None
    try:
        digits = int(value)
    except ValueError:
        digits = 0
    if not 1 <= digits <= EXACT_DIGITS:
        raise UsageError(f"{flag}: expected an integer from 1 to {EXACT_DIGITS}, got {value!r}")
    return digits


def cmd_convert(args: argparse.Namespace) -> int:
    from evotune.core.landscape import LandscapeError
    from evotune.core.landscape_convert import Rounding, convert_files

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
    rounding = Rounding(_digits("--time-digits", args.time_digits), _digits("--cost-digits", args.cost_digits))
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out: {args.out} exists and is not a folder")
    try:
        paths = convert_files(args.sources, args.out, samples, rounding)
    except LandscapeError as exc:
        raise UsageError(str(exc)) from None
    for path in paths:
        print(path)
    return 0
