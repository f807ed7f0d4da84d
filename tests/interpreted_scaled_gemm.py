"""Run triton_matmul's and triton_tma_matmul's kernels under Triton's interpreter on small CPU tensors; print each
case's verification as JSON.

Started by tests/test_triton_tma.py in a process of its own with ``TRITON_INTERPRET=1`` (the variable must be set
before Triton is imported). Reads a JSON list of cases, each ``{"space", "m", "n", "k", "dtype", "scaling",
"point"}`` (``space``: ``triton_matmul`` or ``triton_tma_matmul``, whose persistent grid is given 3 SMs), from
argv[1]; for each, makes the workload's inputs on the CPU (for fp8 scaled per tensor: amax-quantized e4m3 and their
scales), launches the kernel twice on a poisoned output and prints ``{"ok", "error", "why", "out_dtype"}`` of the
workload's verification (scaled fp8: against the dequantized product in fp32).

Triton 3.9's interpreter keeps bf16 as uint16 and its dot multiplies those bits, so the dot here takes bf16
operands as the fp32 numbers they are (as the GPU's tensor cores do), as tests/interpreted_decode.py does.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import triton.language as tl
from triton.runtime import interpreter

from evotune.core.problem import Problem, get_workload
from evotune.measurement.workloads import gemm
from search_spaces import _triton_kernel, _triton_tma

_real_dot = interpreter.InterpreterBuilder.create_dot


def _as_fp32(h):
    if h.dtype.scalar != tl.bfloat16:
        return h
    return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)


def _create_dot(self, a, b, d, *args):
    return _real_dot(self, _as_fp32(a), _as_fp32(b), d, *args)


interpreter.InterpreterBuilder.create_dot = _create_dot
SMS = 3  # the persistent grid's programs: fewer than the tiles, so each walks several


def run(case: dict) -> dict:
    problem = Problem.gemm(case["m"], case["n"], case["k"], case["dtype"], "tn", case.get("scaling", ""))
    inputs = gemm.make_inputs(problem, seed=1, device="cpu")
    if case["space"] == "triton_tma_matmul":
        launch = _triton_tma.launcher(case["point"], problem, sms=SMS)[0]
    else:
        launch = _triton_kernel.launcher(case["point"], problem)[0]
    launch(*inputs)
    gemm.poison(inputs[-1])
    launch(*inputs)  # a second launch on a poisoned output: it writes every element
    ok, err, why = get_workload("gemm").verify(problem, inputs)
    return {"ok": ok, "error": err, "why": why, "out_dtype": str(inputs[-1].dtype)}


if __name__ == "__main__":
    print(json.dumps([run(case) for case in json.loads(sys.argv[1])]))
