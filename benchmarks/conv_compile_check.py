"""The int8 conv space's rules against nvcc: every feasible kernel compiles, and the pruned ones do not.

For one convolution per layout (the hand-picked configuration's shape in
NC/32HW32, a ResNet-50 layer in NHWC), every distinct compiled configuration of
the feasible points (the swizzle is a launch argument; ``--sample N``: a uniform
sample of N where there are more) is built for sm_90a with
``nvcc -cubin -Xptxas -v``: device code only, which is where CUTLASS's static
assertions and the register allocation live. A sample of the points each
compile-time rule prunes is built too. Reported per layout: how many feasible
kernels compiled, the most registers any used and whether any spilled, and per
rule how many of its pruned points nvcc refused (``warp-k-steps``,
``interleaved-thread-map`` and ``nhwc-thread-map`` are rules of the compiler;
``turing-two-stage`` keeps the 8x8x16 MMA to the pipeline CUTLASS's Turing kernels
use, and others, such as ``interleaved-epilogue``, compile and are pruned for what
the kernel does). No GPU is needed.

Usage (needs nvcc and the CUTLASS headers: ``pip install nvidia-cutlass`` or ``CUTLASS_PATH``)::

    python benchmarks/conv_compile_check.py --workers 2 --pruned 6 --sample 600 --out runs/conv_compile_check.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.hardware import get_hardware  # noqa: E402
from evotune.core.problem import get_workload  # noqa: E402
from evotune.core.space import Context  # noqa: E402
from evotune.running.compile_only import first_error_line  # noqa: E402
from search_spaces import _cutlass_build as cb  # noqa: E402
from search_spaces import _cutlass_conv as cc  # noqa: E402
from search_spaces.cutlass_conv2d_int8 import SPACE  # noqa: E402

PROBLEMS = {
    "nc32hw32": {"N": 10, "C": 128, "H": 72, "W": 120, "K": 128, "R": 3, "S": 3, "pad": 1, "dtype": "int8",
                 "layout": "nc32hw32"},
    "nhwc": {"N": 8, "C": 64, "H": 56, "W": 56, "K": 64, "R": 3, "S": 3, "pad": 1, "dtype": "int8", "layout": "nhwc"},
}
COMPILER_RULES = ("warp-k-steps", "interleaved-thread-map", "nhwc-thread-map", "turing-two-stage")


def compile_one(job: tuple[dict, dict]) -> dict:
    """nvcc -cubin of one configuration: ok, seconds, registers, spill bytes, the first error line."""
    point, fields = job
    problem = get_workload("conv2d").parse(fields)
    with tempfile.TemporaryDirectory(prefix="evotune-check-") as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(cc.source(point, problem))
        started = time.perf_counter()
        # ptxas -v: the spill counts, which the cubin does not keep
        proc = subprocess.run(cb.nvcc_command(src, Path(tmp) / "k.cubin", cubin=True, extra=("-Xptxas", "-v")),
                              capture_output=True, text=True)
    text = proc.stderr
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", text)]
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", text)]
    error = first_error_line(text) if proc.returncode else ""
    return {"ok": proc.returncode == 0, "s": round(time.perf_counter() - started, 2),
            "registers": max(regs, default=None), "spill": max(spills, default=0), "error": error[:200]}


def jobs_for(layout: str, pruned_per_rule: int, rng: random.Random, sample: int = 0) -> tuple[list, list]:
    fields = PROBLEMS[layout]
    ctx = Context(get_hardware("H100"), get_workload("conv2d").parse(fields))
    fs = SPACE.feasible(ctx)
    seen, feasible = set(), []
    for i in range(len(fs)):
        p = fs.point(i)
        key = tuple(p[k] for k in cc.COMPILE_KNOBS)
        if key not in seen:
            seen.add(key)
            feasible.append((dict(p, swizzle=1), fields))
    if sample and len(feasible) > sample:  # a uniform sample of the distinct kernels
        feasible = rng.sample(feasible, sample)
    by_rule: dict[str, list] = {}
    for p in SPACE.points():
        reason = SPACE.check(p, ctx)
        rule = reason.split(":")[0] if reason else None
        if rule in COMPILER_RULES and p["swizzle"] == 1:
            by_rule.setdefault(rule, []).append(p)
    pruned = [(rule, (p, fields)) for rule, pts in sorted(by_rule.items())
              for p in rng.sample(pts, min(pruned_per_rule, len(pts)))]
    return feasible, pruned


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pruned", type=int, default=6, help="pruned points built per compiler rule and layout")
    ap.add_argument("--sample", type=int, default=0, help="at most this many feasible kernels per layout (0: all)")
    ap.add_argument("--layout", action="append", choices=sorted(PROBLEMS), help="default: both")
    ap.add_argument("--out", default="runs/conv_compile_check.json")
    args = ap.parse_args()
    rng = random.Random(0)
    report: dict = {"date": time.strftime("%Y-%m-%d"), "toolchain": cb.toolchain()}
    with ProcessPoolExecutor(args.workers) as pool:
        for layout in args.layout or list(PROBLEMS):
            feasible, pruned = jobs_for(layout, args.pruned, rng, args.sample)
            built = list(pool.map(compile_one, feasible))
            refused = list(pool.map(compile_one, [job for _, job in pruned]))
            failed = [(job[0], r["error"]) for job, r in zip(feasible, built, strict=True) if not r["ok"]]
            per_rule: Counter = Counter()
            tried: Counter = Counter()
            for (rule, _), r in zip(pruned, refused, strict=True):
                tried[rule] += 1
                per_rule[rule] += not r["ok"]
            report[layout] = {
                "sampled": bool(args.sample) and len(feasible) == args.sample,
                "feasible_kernels": len(feasible), "compiled": sum(r["ok"] for r in built),
                "failed": failed[:20], "max_registers": max((r["registers"] or 0) for r in built),
                "spilled": sum(r["spill"] > 0 for r in built),
                "median_s": sorted(r["s"] for r in built)[len(built) // 2] if built else None,
                "pruned_refused": {rule: f"{per_rule[rule]} of {tried[rule]}" for rule in sorted(tried)},
            }
            print(layout, json.dumps(report[layout]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return 0 if all(report[k]["compiled"] == report[k]["feasible_kernels"] for k in args.layout or PROBLEMS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
