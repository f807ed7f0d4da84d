"""Run the decode GEMM kernels under Triton's interpreter on tiny CPU tensors; print each case's error as JSON.

Started by tests/test_triton_decode.py in a process of its own with ``TRITON_INTERPRET=1`` (the variable must
be set before Triton is imported, and must not reach the test process's other kernels). Reads a JSON list of
cases, each ``{"dtype", "m", "n", "k", "point"}`` and for fp8 a ``"scaling"`` ("" unscaled, "tensor", "row"),
from argv[1]; prints a list of ``{"error", "int32", "same_dtype", "out_dtype", "dots"}``: the relative
Frobenius-norm error against the float64 product (int8: the count of outputs that differ; scaled fp8: against the
dequantized product, on the workload's amax-quantized inputs), and how many ``tl.dot`` its launches ran.

Triton 3.9's interpreter keeps bf16 as uint16 and its dot multiplies those bits, so the dot here takes
bf16 operands as the fp32 numbers they are (as the GPU's tensor cores do); everything else is Triton's own.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

from evotune.core.problem import Problem
from evotune.measurement.workloads import gemm, gemm_fp8
from search_spaces import _triton_decode

_real_dot = interpreter.InterpreterBuilder.create_dot
_dots = [0]  # tl.dot calls of the case being run


def _as_fp32(h):
    if h.dtype.scalar != tl.bfloat16:
        return h
    return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)


def _create_dot(self, a, b, d, *args):
    _dots[0] += 1
    return _real_dot(self, _as_fp32(a), _as_fp32(b), d, *args)


interpreter.InterpreterBuilder.create_dot = _create_dot


def inputs(problem: Problem):
    """``a`` (M, K), ``b`` the (K, N) view of (N, K) weights, (scaled fp8: their scales,) and a poisoned ``c``."""
    if problem.dtype == "fp8":
        return gemm.make_inputs(problem, seed=1, device="cpu")
    gen = torch.Generator().manual_seed(1)
    if problem.dtype == "int8":
        a = torch.randint(-8, 8, (problem.m, problem.k), generator=gen, dtype=torch.int8)
        w = torch.randint(-8, 8, (problem.n, problem.k), generator=gen, dtype=torch.int8)
        c = torch.full((problem.m, problem.n), 0x7F7F7F7F, dtype=torch.int32)
    else:
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[problem.dtype]
        a = (torch.randn(problem.m, problem.k, generator=gen) * 0.5).to(dt)
        w = (torch.randn(problem.n, problem.k, generator=gen) * 0.5).to(dt)
        c = torch.full((problem.m, problem.n), float("nan"), dtype=dt)
    return a, w.t(), c


def run(case: dict) -> dict:
    problem = Problem.gemm(case["m"], case["n"], case["k"], case["dtype"], "tn", case.get("scaling", ""))
    tensors = inputs(problem)
    _dots[0] = 0
    a, b, c = tensors[0], tensors[1], tensors[-1]
    launch = _triton_decode.launcher(case["point"], problem)[0]
    launch(*tensors)
    gemm.poison(c)  # poisoned again: the second launch writes all
    launch(*tensors)  # a launch after the first: what one launch leaves (REDUCE=last's counts) serves the next
    if problem.scaling:
        ref = gemm_fp8.scaled_reference(problem, *tensors[:4]).double()
    else:
        ref = a.double() @ b.double()
    if problem.dtype == "int8":
        return {"error": int((c.double() != ref).sum()), "int32": c.dtype == torch.int32, "dots": _dots[0]}
    err = float((c.double() - ref).norm() / ref.norm())
    return {"error": err if err == err else float("inf"), "int32": False, "same_dtype": c.dtype == a.dtype,
            "out_dtype": str(c.dtype), "dots": _dots[0]}


if __name__ == "__main__":
    print(json.dumps([run(case) for case in json.loads(sys.argv[1])]))
