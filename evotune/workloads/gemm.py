"""The GEMM workload: ``C[m, n] = A[m, k] @ B[k, n]`` in a dtype and a BLAS layout.

The GPU side (inputs, reference, verification, cuBLAS baselines) is
:mod:`evotune.evaluation.gemm`, which the GEMM search spaces also import for
their compile-only inputs; the CPU side checks ``fn(a, b) -> c`` against
``a @ b`` in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from evotune.problem import DTYPES, LAYOUTS, Problem
from evotune.workloads.base import Workload, choice_field, int_field

CPU_TOLERANCE = 1e-9  # relative Frobenius-norm error allowed against the float64 reference a @ b


class GemmWorkload(Workload):
    kind = "gemm"
    fields = ("m", "n", "k", "dtype", "layout")

    def parse(self, table: dict[str, Any]) -> Problem:
        m, n, k = (int_field(table, d) for d in ("m", "n", "k"))
        dtype = choice_field(table, "dtype", "bf16", DTYPES)
        layout = choice_field(table, "layout", "tn", LAYOUTS)
        return Problem.gemm(m, n, k, dtype, layout)

    def key(self, problem: Problem) -> str:
        return f"gemm_{problem.dtype}_{problem.layout}_{problem.m}x{problem.n}x{problem.k}"

    def bucket(self, problem: Problem) -> Problem:
        def r(x: int) -> int:
            return 1 << max(0, round(math.log2(x)))
        return Problem("gemm", r(problem.m), r(problem.n), r(problem.k), problem.dtype, problem.layout)

    def bucket_distance(self, a: Problem, b: Problem) -> float:
        return sum(abs(math.log2(x) - math.log2(y)) for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k)))

    def flops(self, problem: Problem) -> int | None:
        return 2 * problem.m * problem.n * problem.k

    def min_bytes(self, problem: Problem) -> int | None:
        return ((problem.m * problem.k + problem.n * problem.k) * problem.in_bytes
                + problem.m * problem.n * problem.out_bytes)

    def describe(self, problem: Problem) -> str:
        return f"{problem.m}x{problem.n}x{problem.k} {problem.dtype} {problem.layout}"

    def to_dict(self, problem: Problem) -> dict[str, Any]:
        return {"kind": "gemm", "m": problem.m, "n": problem.n, "k": problem.k, "dtype": problem.dtype,
                "layout": problem.layout, "label": problem.label, "extra": dict(problem.extra)}

    # -- GPU: evotune.evaluation.gemm, with the kernel called as kernel(a, b, c)
    def make_inputs(self, problem: Problem, seed: int = 0, fill: bool = True) -> tuple[Any, ...]:
        from evotune.evaluation import gemm

        return gemm.make_inputs(problem, seed=seed, fill=fill)

    def poison(self, inputs: tuple[Any, ...]) -> None:
        from evotune.evaluation import gemm

        gemm.poison(inputs[-1])

    def verify(self, problem: Problem, inputs: tuple[Any, ...]) -> tuple[bool, float, str]:
        from evotune.evaluation import gemm

        a, b, c = inputs
        return gemm.verify(problem, a, b, c)

    def baselines(self, problem: Problem) -> dict[str, Callable[..., object]]:
        from evotune.evaluation import gemm

        return gemm.baselines(problem)

    # -- CPU: fn(a, b) -> c on float64 arrays
    def cpu_inputs(self, problem: Problem, seed: int) -> tuple[Any, ...]:
        import numpy as np

        rng = np.random.default_rng(seed)
        return rng.standard_normal((problem.m, problem.k)), rng.standard_normal((problem.k, problem.n))

    def cpu_verify(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> tuple[bool, float | None, str]:
        a, b = inputs
        return relative_error_check(out, a @ b, CPU_TOLERANCE)


def relative_error_check(out: Any, ref: Any, tolerance: float) -> tuple[bool, float | None, str]:
    """(ok, relative Frobenius-norm error, why not) of a numpy ``out`` against ``ref``."""
    import numpy as np

    if not isinstance(out, np.ndarray):
        return False, None, f"returned {type(out).__name__}, not an array"
    if out.shape != ref.shape:
        return False, None, f"shape {out.shape}, expected {ref.shape}"
    if not np.all(np.isfinite(out)):
        return False, None, "non-finite values in the result"
    err = float(np.linalg.norm(out.astype(np.float64) - ref) / max(float(np.linalg.norm(ref)), 1e-300))
    if err > tolerance:
        return False, err, f"relative error {err:.3g} > {tolerance:g}"
    return True, err, ""


WORKLOAD = GemmWorkload()
