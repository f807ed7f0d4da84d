"""The body of ``python -m evotune tune-model``: plan, check, run the workers, export, report.

Every input is checked before anything is created (the model and its fields, ``--tp``, ``--dtype``,
``--batch-sizes``, ``--gpus`` against the host, the tuner's support for the plan): a bad one raises
:class:`~evotune.model.models.ModelError`, one line, and the command line exits 2 with nothing written.
``--dry-run`` prints the plan and its estimate and writes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evotune.model import exports, report
from evotune.model.models import ModelError, load_model
from evotune.model.plan import (
    BUILD_S,
    DEFAULT_BUDGET,
    EVAL_S,
    KEY_S,
    START_S,
    Plan,
    estimate,
    estimate_kernel,
    make_plan,
    only,
    parse_batch_sizes,
    parse_kernels,
)
from evotune.model.preload import DEFAULT_TUNER
from evotune.model.runner import Progress, RunOptions, run, worker_count
from evotune.storage.url import StorageError, with_driver


@dataclass(frozen=True)
class TuneModelArgs:
    model: str
    tp: int = 1
    dtype: str | None = None
    batch_sizes: str = "vllm"
    gpus: str = "all"
    storage: str | None = None
    out: str | None = None
    dry_run: bool = False
    progress: bool = True
    tuner: str = DEFAULT_TUNER
    kernels: str = "all"
    workers_per_gpu: int = 1


def _hours(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min"


def plan_text(plan: Plan) -> str:
    """The plan as ``--dry-run`` prints it: each kernel's layers, keys and the two estimates."""
    total = estimate(plan, DEFAULT_BUDGET)
    lines = [f"{plan.model.name} ({plan.model.source}), tp {plan.tp}, {plan.dtype}, batch sizes "
             f"{','.join(map(str, plan.batch_sizes))}: {len(plan.kernels)} kernels, {total.keys} keys", ""]
    head = f"{'kernel':<52} {'keys':>5} {'evotune evals':>14} {'GPU time':>10} {'grid evals':>11} {'grid GPU time':>14}"
    lines += [head, "-" * len(head)]
    for kernel in plan.kernels:
        e = estimate_kernel(kernel, DEFAULT_BUDGET)
        lines.append(f"{kernel.shape.name:<52} {e.keys:>5} {e.evaluations:>14} {_hours(e.gpu_s):>10} "
                     f"{e.grid_evaluations:>11} {_hours(e.grid_gpu_s):>14}")
        lines.append(f"    layers: {', '.join(kernel.layers)}; M = {', '.join(str(k.m) for k in kernel.keys)}")
    lines += ["-" * len(head),
              f"{'total':<52} {total.keys:>5} {total.evaluations:>14} {_hours(total.gpu_s):>10} "
              f"{total.grid_evaluations:>11} {_hours(total.grid_gpu_s):>14}", "",
              f"Estimated GPU time, on one GPU. evotune: {DEFAULT_BUDGET} evaluations a key (the whole grid where "
              f"it is smaller), {KEY_S} s a key as measured on an H200 (the evaluations, the builds beside them, "
              f"the confirmation), plus about {START_S:.0f} s to start. The grid: every configuration of the "
              f"family's space timed at every key, {EVAL_S} s each as vLLM's benchmarks time one, plus {BUILD_S} s "
              "per configuration built (once per kernel shape), one after another. N GPUs divide the time by "
              "about N."]
    return "\n".join(lines)


def default_out(plan: Plan) -> Path:
    return Path("runs") / "tune_model" / f"{plan.model.name}-tp{plan.tp}-{plan.dtype}"


def tune_model(args: TuneModelArgs, say: Callable[[str], None] = print) -> int:
    model = load_model(args.model)
    plan = only(make_plan(model, args.tp, args.dtype, parse_batch_sizes(args.batch_sizes)),
                parse_kernels(args.kernels))
    if args.dry_run:
        say(plan_text(plan))
        return 0
    devices = worker_count(args.gpus)
    if args.tuner == DEFAULT_TUNER:
        from evotune.model.tuning import check_supported

        check_supported(plan)
    out = Path(args.out) if args.out else default_out(plan)
    if out.exists() and not out.is_dir():
        raise ModelError(f"--out {out}: not a folder")
    storage = args.storage or f"sqlite:///{(out / 'tune_model.db').resolve()}"
    if args.storage is not None:
        try:
            with_driver(args.storage)
        except StorageError as exc:
            raise ModelError(f"--storage: {exc}") from None
    options = RunOptions(args.model, args.tp, plan.dtype, args.batch_sizes, storage, str(out.resolve()),
                         args.tuner, args.kernels, args.workers_per_gpu)
    out.mkdir(parents=True, exist_ok=True)
    progress = _progress_printer() if args.progress else None
    outcomes = run(options, devices, progress)
    if progress is not None:
        sys.stderr.write("\n")
    written = exports.write_server_files(outcomes.values(), out, plan.dtype, model.fp8_block)
    tuned = exports.write_tuned(outcomes.values(), out, plan.dtype, gemm_layouts(args.tuner), plan.ident)
    files = [str(p.relative_to(out)) for p in [*written, *([tuned] if tuned else [])]]
    rep = report.build_report(plan, outcomes, files)
    md, js = report.write_report(rep, out)
    missing = len(plan.keys) - len(outcomes)
    kept = [o.key for o in outcomes.values() if exports.untuned_wins(o)]
    say(f"{len(outcomes)}/{len(plan.keys)} keys decided; {len(written)} config files under {out} (vllm/, sglang/)"
        + (", the dense GEMMs in tuned.json (lookup())" if tuned else "") + f"; report {md} and {js}"
        + (f"; {missing} keys left: run the same command to go on" if missing else "")
        + (f"; {len(kept)} keys keep their untuned default, faster than any configuration found ({', '.join(kept)})"
           if kept else ""))
    return 0


def gemm_layouts(tuner: str) -> dict[str, str]:
    """The operand layout of the dense GEMMs the tuner times, by space: the default tuner's kernels', else none
    (``tn``: y = x W^T, the layer's own)."""
    if tuner == DEFAULT_TUNER:
        from evotune.model.tuning import LAYOUTS

        return dict(LAYOUTS)
    return {}


def _progress_printer() -> Callable[[Progress], None]:
    tty = sys.stderr.isatty()

    def show(p: Progress) -> None:
        if tty:
            sys.stderr.write("\r" + p.line() + "\x1b[K")
        else:
            sys.stderr.write(p.line() + "\n")
        sys.stderr.flush()

    return show
