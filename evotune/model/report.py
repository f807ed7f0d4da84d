"""The run's report, Markdown and JSON: per kernel its keys, evaluations, GPU-seconds (the seconds its keys held
their GPU, compiles included) and of those the seconds the GPU spent timing, the grid's GPU-seconds estimated from its
size (``plan.estimate_kernel``), and the ratio of the untuned default's time to the tuned
configuration's where both were measured (vLLM's default configuration for its Triton kernels, cuBLAS for dense
GEMMs; above 1: tuning made it faster)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evotune.model.outcome import Outcome
from evotune.model.plan import DEFAULT_BUDGET, EVAL_S, Plan, estimate_kernel


@dataclass(frozen=True)
class KernelRow:
    kernel: str
    family: str
    layers: list[str]
    keys: int
    decided: int
    evaluations: int
    gpu_s: float
    grid_gpu_s: float
    untuned: str
    ratio_geomean: float | None  # untuned / tuned over the keys where both were timed
    ratio_min: float | None
    ratio_max: float | None
    measured: int  # keys with both times
    #: configurations compiled for each key, in batch-size order (None: not counted, e.g. under the interpreter)
    compiles: list[int | None] = field(default_factory=list)
    #: of the configurations timed, those found built (for an earlier key, by any worker) in the on-disk cache
    loads: list[int | None] = field(default_factory=list)
    #: of ``gpu_s``, the GPU's seconds on timing (evaluations and confirmations; None: no key counted them)
    timing_s: float | None = None


@dataclass(frozen=True)
class Report:
    model: str
    tp: int
    dtype: str
    device: str
    kernels: list[KernelRow]
    outcomes: list[dict[str, object]]
    files: list[str]


def build_report(plan: Plan, outcomes: dict[str, Outcome], files: list[str]) -> Report:
    rows = []
    for kernel in plan.kernels:
        got = [outcomes[k.ident] for k in kernel.keys if k.ident in outcomes]
        ratios = [o.ratio for o in got if o.ratio is not None]
        rows.append(KernelRow(kernel.shape.name, kernel.shape.family.value, kernel.layers, len(kernel.keys),
                              len(got), sum(o.evaluations for o in got), round(sum(o.gpu_s for o in got), 3),
                              round(estimate_kernel(kernel, DEFAULT_BUDGET).grid_gpu_s, 1),
                              kernel.shape.family.untuned,
                              None if not ratios else math.exp(sum(math.log(r) for r in ratios) / len(ratios)),
                              min(ratios, default=None), max(ratios, default=None), len(ratios),
                              [o.compiles for o in got], [o.loads for o in got], _timing(got)))
    devices = sorted({o.device for o in outcomes.values()})
    ordered = [outcomes[k.ident].to_json() for k in plan.keys if k.ident in outcomes]
    return Report(plan.model.name, plan.tp, plan.dtype, ", ".join(devices) or "-", rows, ordered, files)


def _timing(got: list[Outcome]) -> float | None:
    counted = [o.timing_s for o in got if o.timing_s is not None]
    return round(sum(counted), 3) if counted else None


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}x"


def _counts(values: list[int | None]) -> str:
    return "-" if all(v is None for v in values) else ", ".join("-" if v is None else str(v) for v in values)


def markdown(report: Report) -> str:
    lines = [f"# tune-model: {report.model}, tp {report.tp}, {report.dtype}", "",
             f"Device: {report.device}. The grid's GPU-seconds are estimated from its size: every configuration "
             f"at every key, {EVAL_S} s an evaluation plus one build per configuration. Ratio: the untuned "
             "default's time over the tuned configuration's, geometric mean over the keys where both were timed "
             "(min - max). Compiles: configurations the compiler built for each key in batch-size order (a "
             "configuration built for an earlier key of the same specialisation is loaded, not built). GPU-s: the "
             "seconds the keys held their GPU (compiles included); timing-s: of those, the GPU's on timing.", "",
             "| kernel | layers | keys | evaluations | GPU-s | timing-s | grid GPU-s (est.) | vs | ratio | min - max | "
             "compiles per key |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.kernels:
        timing = "-" if r.timing_s is None else f"{r.timing_s:.1f}"
        lines.append(f"| {r.kernel} | {', '.join(r.layers)} | {r.decided}/{r.keys} | {r.evaluations} | "
                     f"{r.gpu_s:.1f} | {timing} | {r.grid_gpu_s:.0f} | {r.untuned} | {_r(r.ratio_geomean)} | "
                     f"{_r(r.ratio_min)} - {_r(r.ratio_max)} | {_counts(r.compiles)} |")
    lines += ["", "## Files", ""] + [f"- `{f}`" for f in report.files] + [""]
    return "\n".join(lines)


def write_report(report: Report, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "report.md", out / "report.json"
    md.write_text(markdown(report))
    js.write_text(json.dumps(asdict(report), indent=1) + "\n")
    return md, js
