"""``evotune record``: measure every feasible point of a space for each problem, and write landscapes.

Recording is an ordinary study (``NAME/PROBLEM/record``) driven by the
exhaustive strategy, best-estimated points first, so it resumes like any run
and can be done in pieces (``--seconds``). After each piece the landscape file
is (re)written from the study: every point measured so far with its status,
bounded timing samples, compile and benchmark time, plus the device, clocks,
versions, date and the baselines timed in the same run. ``complete`` says
whether every feasible point is in it.

Example::

    python -m evotune record experiments/h100_bf16_gemm.toml --seconds 540 --out experiments/landscapes/h100
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from rich.console import Console

from evotune.evaluation.landscape import landscape_document, write_landscape
from evotune.evaluation.result import EvalResult
from evotune.experiment import Budget, Experiment, ExperimentError
from evotune.runner import Target, make_evaluator, preflight, study_attrs, study_name, targets
from evotune.strategies import make_strategy
from evotune.study import StudyStore, make_storage
from evotune.tuner import tune

MAX_SAMPLES = 16  # per point in the written landscape: keeps shipped files small


def record_experiment(exp: Experiment, out_dir: Path, seconds: float | None, console: Console) -> list[Path]:
    resolved = targets(exp)
    preflight(exp, resolved)
    try:
        storage = make_storage(exp.storage)
    except Exception as exc:  # a driver error: the URL is what the user can fix
        raise ExperimentError(exp.path, "storage.url", f"cannot open {exp.storage!r}: {exc}") from None
    written = []
    for target in resolved:
        evaluator = make_evaluator(exp, target)
        try:
            if exp.oracle == "gpu":
                target.device = evaluator.device_info()
                target.baselines = evaluator.baselines(target.problem)
            name = study_name(exp, target, "record")
            attrs = study_attrs(exp, target, "exhaustive", 0)
            store = StudyStore.open(storage, name, target.space, attrs)
            feasible = target.space.feasible(target.ctx)
            strategy = make_strategy("exhaustive", target.space, feasible, ctx=target.ctx, seeding="hardware")
            result = tune(target.space, target.ctx, evaluator, strategy, store,
                          Budget(trials=len(feasible), seconds=seconds))
            console.print(f"  {name}: {result.trials} of {len(feasible)} feasible points recorded"
                          f" ({result.new_trials} new)")
            written.append(write_recorded(store, target, exp, len(feasible), out_dir))
        finally:
            evaluator.close()
    return written


def write_recorded(store: StudyStore, target: Target, exp: Experiment, feasible: int, out_dir: Path) -> Path:
    history = store.history()
    rows = [(r.point, EvalResult(r.status, time_ms=r.value, samples_ms=r.attrs.get("samples_ms", []),
                                 compile_s=r.attrs.get("compile_s", 0.0), bench_s=r.attrs.get("bench_s", 0.0),
                                 error=r.attrs.get("error"), message=r.attrs.get("message", "")))
            for r in history]
    attrs = store.study.user_attrs
    meta = {
        "date": _dt.date.today().isoformat(), "device": attrs.get("device"),
        "device_info": attrs.get("device_info", {}), "baselines": attrs.get("baselines", {}),
        "hardware": attrs.get("hardware"), "feasible": feasible, "recorded": len(rows),
        "complete": len(rows) >= feasible, "experiment": exp.name, "study": store.study.study_name,
    }
    doc = landscape_document(target.space.params, rows, target.problem, meta, target.space.name, MAX_SAMPLES)
    return write_landscape(out_dir / f"{target.space.name}_{target.problem.key}.json.gz", doc)
