"""Run the block-scaled fp8 GEMM kernel under Triton's interpreter on small CPU tensors; print each case's
verification as JSON.

Started by tests/test_triton_block_fp8.py in a process of its own with ``TRITON_INTERPRET=1`` (the variable must
be set before Triton is imported). Reads a JSON list of cases, each ``{"m", "n", "k", "point"}``, from argv[1];
for each, makes the workload's inputs on the CPU (amax-quantized e4m3 and their scales), launches the kernel
twice on a poisoned output and prints ``{"ok", "error", "why"}`` of the workload's verification against the
dequantized product. Triton 3.9's interpreter runs e4m3 dots exactly in fp32; it rounds the bf16 store toward
zero, about twice the error of the GPU's rounding, well within the tolerance.
"""

from __future__ import annotations

import json
import sys

from evotune.core.problem import Problem, get_workload
from evotune.measurement.workloads import gemm
from search_spaces import _triton_block_fp8


def run(case: dict) -> dict:
    problem = Problem.gemm(case["m"], case["n"], case["k"], "fp8", "tn", "block")
    inputs = gemm.make_inputs(problem, seed=case.get("seed", 1), device="cpu")
    launch = _triton_block_fp8.launcher(case["point"], problem)[0]
    launch(*inputs)
    gemm.poison(inputs[-1])
    launch(*inputs)  # a second launch on a poisoned output: it writes every element
    ok, err, why = get_workload("gemm").verify(problem, inputs)
    return {"ok": ok, "error": err, "why": why}


if __name__ == "__main__":
    print(json.dumps([run(case) for case in json.loads(sys.argv[1])]))
