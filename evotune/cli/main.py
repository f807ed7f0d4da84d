"""Command line: ``python -m evotune run | worker | record | best | plot | dashboard | spaces | compare | convert |
tune-kernel | export-configs | tune-model | doctor`` (and ``--version``).

Bad input (an experiment file, a path, a name) ends with one line on stderr
that names the file and the field, and exit code 2. Nothing already finished
is lost: trials are stored as they finish.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable

from evotune.cli import doctor, kernels, models, results, tuning
from evotune.cli.output import EXIT_USAGE, UsageError
from evotune.running.experiment import ExperimentError
from evotune.running.schedule import SPLITS
from evotune.storage.journal import JournalWarning
from evotune.storage.url import StorageError


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    shown = warnings.formatwarning
    warnings.formatwarning = _notices(shown)
    try:
        return args.func(args) or 0
    except (ExperimentError, UsageError, StorageError) as exc:
        print(f"evotune: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("evotune: interrupted; finished trials are stored, run the same command again to resume",
              file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = shown  # a caller of main() gets its own display of warnings back


def _notices(form: Callable[..., str]) -> Callable[..., str]:
    """How warnings are written: a journal's notice (lines skipped or cut short) as one line, as the commands say
    their other warnings, not as Python's ``path:line: Category: ...`` with a line of source; any other warning
    as ``form`` writes it."""

    def notice(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               line: str | None = None) -> str:
        if issubclass(category, JournalWarning):
            return f"warning: {message}\n"
        return form(message, category, filename, lineno, line)

    return notice


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evotune", description="Evolutionary autotuner for GPU kernels.")
    p.add_argument("--version", action="version", version=f"evotune {doctor.evotune_version()}")
    sub = p.add_subparsers(metavar="COMMAND")

    run = sub.add_parser("run", help="tune an experiment (resumes if its storage holds trials)")
    run.add_argument("experiment", help="path to an experiment .toml file")
    run.add_argument("--no-progress", action="store_true", help="no live progress bar")
    run.add_argument("--no-plots", action="store_true", help="skip writing PNGs at the end")
    run.set_defaults(func=tuning.cmd_run)

    worker = sub.add_parser("worker", help="join the experiment's studies from another process or host")
    worker.add_argument("experiment", help="path to an experiment .toml file (its storage must be shared)")
    worker.add_argument("--no-progress", action="store_true", help="no live progress bar")
    _split_arg(worker)
    worker.add_argument("--costs", metavar="PATH", help="write this worker's measured costs (start-up, per problem, "
                                                        "per evaluation) as JSON")
    worker.set_defaults(func=tuning.cmd_worker)

    record = sub.add_parser("record", help="measure every feasible point of the space; write landscape files")
    record.add_argument("experiment", help="path to an experiment .toml file (its strategies are ignored)")
    record.add_argument("--out", help="folder for the landscape files (default runs/landscapes; with "
                                      "--compile-only, runs/compile); the shipped files under "
                                      "evotune/landscapes are rewritten only when --out names their folder")
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
    record.set_defaults(func=tuning.cmd_record)

    plot = sub.add_parser("plot", help="write convergence and parameter-effect PNGs")
    _source_args(plot)
    plot.add_argument("--out", help="output folder (default: the experiment's outputs.plots, or runs/plots/)")
    plot.set_defaults(func=results.cmd_plot)

    best = sub.add_parser("best", help="print the best configurations and export them as JSON")
    _source_args(best)
    best.add_argument("--json", help="export path (default: the experiment's outputs.best)")
    best.set_defaults(func=results.cmd_best)

    dash = sub.add_parser("dashboard", help="serve optuna-dashboard for the experiment's storage")
    _source_args(dash)
    dash.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    dash.add_argument("--port", type=int, default=8080)
    dash.set_defaults(func=results.cmd_dashboard)

    spaces = sub.add_parser("spaces", help="list search spaces with their size and feasible count")
    spaces.add_argument("--hardware", default="H100", help="GPU to prune for: A100, H100, H200, B200 or auto")
    spaces.add_argument("--problem", default="4096x4096x4096", help="MxNxK of the GEMM to prune for")
    spaces.add_argument("--dtype", default="bf16")
    spaces.add_argument("--layout", default="tn")
    spaces.add_argument("--scaling", default="", help="fp8 scales: tensor, row or block (default: unscaled)")
    spaces.add_argument("--verbose", "-v", action="store_true",
                        help="also say what each space is, list each parameter's choices and how the pruning fared "
                             "against the compiler")
    spaces.add_argument("--compiled", metavar="DIR", default=None,
                        help="where compile-only files are looked for (default: the shipped ones, "
                             "evotune/landscapes/compile)")
    spaces.set_defaults(func=results.cmd_spaces)

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
    cmp.set_defaults(func=results.cmd_compare)

    conv = sub.add_parser("convert", help="rewrite landscapes (e.g. Kernel Tuner cache files) in evotune's format")
    conv.add_argument("sources", nargs="*", metavar="SRC", help="Kernel Tuner cache file or evotune landscape")
    conv.add_argument("--out", metavar="DIR", help="folder for the converted files, each named SRC's stem + .json.gz")
    conv.add_argument("--samples", default="0", metavar="N",
                      help="timing samples kept per point, spread over their range (default 0: replay reads none)")
    conv.add_argument("--time-digits", metavar="N",
                      help="significant digits kept of each time, at least N: more where N would make two different "
                           "times equal (default: every digit)")
    conv.add_argument("--cost-digits", metavar="N",
                      help="significant digits kept of each compile and benchmark time (default: every digit)")
    conv.set_defaults(func=results.cmd_convert)

    kernels.add_kernel_commands(sub)
    models.add_commands(sub)

    doc = sub.add_parser("doctor", help="what this machine can run (GPU, Triton, CuTe DSL, CUTLASS C++, torch, "
                                        "the dashboard) and what to install for the rest")
    doc.set_defaults(func=doctor.cmd_doctor)
    return p


def _split_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", choices=SPLITS, default="problems",
                   help="beside other workers: take whole problems first and share the points of the last ones "
                        "(problems, the default), or share the points of every problem (points)")


def _source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", nargs="?", help="experiment .toml (its storage and name are used)")
    p.add_argument("--storage", help="an Optuna storage URL instead of an experiment file")
    p.add_argument("--name", help="only studies of this experiment name (with --storage)")


