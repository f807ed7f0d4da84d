"""The GEMM workload: ``C[m, n] = A[m, k] @ B[k, n]`` in a dtype and a BLAS layout.

The CPU side checks ``fn(a, b) -> c`` against ``a @ b`` in float64. The GPU side
(inputs, reference, verification, cuBLAS baselines; torch, imported when first used)
is the functions below, which the GEMM search spaces also take for their compile-only
inputs.

GEMM inputs, the reference, verification and the cuBLAS baselines (torch, on the GPU).

Operands follow the problem's layout (BLAS letters: ``t`` row-major, ``n``
column-major): ``a`` is an (m, k) view and ``b`` a (k, n) view whose strides
say which dimension is contiguous; ``c`` is (m, n) row-major. Inputs are
fresh random numbers, never zeros, and the output is poisoned (NaN, or a
sentinel for int32) before each checked launch, so an unwritten element fails.

A scaled fp8 GEMM (``dtype = "fp8"`` with a ``scaling``) takes the scales of its operands as well:
``kernel(a, b, scale_a, scale_b, c)``, checked against the dequantized product
(:mod:`evotune.measurement.workloads.gemm_fp8`).

Example::

    a, b, c = make_inputs(problem, seed=1)
    kernel(a, b, c)
    ok, err, why = verify(problem, a, b, c)
"""


from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from evotune.core.problem import DTYPES, LAYOUTS, SCALINGS, Problem, Workload, choice_field, int_field
from evotune.measurement.workloads import gemm_fp8

# relative Frobenius-norm error allowed per input dtype (fp32 accumulate); int8 must be exact
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp8": 6e-2, "fp32": 1e-4, "int8": 0.0}
INT_SENTINEL = 0x7F7F7F7F


def torch_dtypes(problem: Problem) -> tuple[Any, Any]:
    import torch

    table = {"bf16": (torch.bfloat16, torch.bfloat16), "fp16": (torch.float16, torch.float16),
             "fp8": (torch.float8_e4m3fn, torch.bfloat16), "int8": (torch.int8, torch.int32),
             "fp32": (torch.float32, torch.float32)}
    return table[problem.dtype]


def _operand(rows: int, cols: int, contiguous_cols: bool, dtype: Any, gen: Any, fill: bool = True,
             device: str = "cuda") -> Any:
    """A (rows, cols) view; ``contiguous_cols`` means the column index is the fast one (row-major)."""
    import torch

    shape = (rows, cols) if contiguous_cols else (cols, rows)
    if not fill:
        x = torch.empty(shape, device=device, dtype=dtype)
    elif dtype in (torch.int8,):
        x = torch.randint(-8, 8, shape, generator=gen, device=device, dtype=torch.int8)
    else:
        x = (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.5).to(dtype)
    return x if contiguous_cols else x.t()


def make_inputs(problem: Problem, seed: int = 0, fill: bool = True, device: str = "cuda") -> tuple[Any, ...]:
    """Random ``a`` (m, k), ``b`` (k, n) in the problem's layout, and a poisoned ``c`` (m, n); a scaled fp8
    problem's scales between them (``a, b, scale_a, scale_b, c``).

    ``fill=False`` only allocates them (no kernel runs): enough to compile against.
    """
    import torch

    if problem.scaling:
        return gemm_fp8.scaled_inputs(problem, seed, fill, device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    in_dt, out_dt = torch_dtypes(problem)
    a = _operand(problem.m, problem.k, problem.k_major("a"), in_dt, gen, fill, device)
    b_kn_rowmajor = not problem.k_major("b")  # B is (k, n); K-major means column-major
    b = _operand(problem.k, problem.n, b_kn_rowmajor, in_dt, gen, fill, device)
    c = torch.empty((problem.m, problem.n), dtype=out_dt, device=device)
    if fill:
        poison(c)
    return a, b, c


def poison(c: Any) -> None:
    if c.dtype.is_floating_point:
        c.fill_(float("nan"))
    else:
        c.fill_(INT_SENTINEL)


def reference(problem: Problem, a: Any, b: Any) -> Any:
    """The exact-enough product: float64 for int8 (exact below 2**53), float32 without TF32 for floats."""
    import torch

    if problem.dtype == "int8":
        return a.to(torch.float64) @ b.to(torch.float64)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return a.to(torch.float32) @ b.to(torch.float32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def verify(problem: Problem, a: Any, b: Any, c: Any) -> tuple[bool, float, str]:
    """Compare ``c`` with the reference: (passed, relative error, reason when it failed)."""
    import torch

    ref = reference(problem, a, b)
    out = c.to(ref.dtype)
    if not torch.isfinite(out).all():
        bad = int((~torch.isfinite(out)).sum())
        return False, float("inf"), f"{bad} output elements are NaN/inf (unwritten or overflowed)"
    err = float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))
    tol = TOLERANCE[problem.dtype]
    if problem.dtype == "int8":
        wrong = int((out != ref).sum())
        if wrong:
            return False, err, f"{wrong} of {out.numel()} int32 outputs differ from the exact product"
        return True, 0.0, ""
    if err > tol:
        return False, err, f"relative error {err:.3g} exceeds {tol:g} for {problem.dtype}"
    return True, err, ""


def baselines(problem: Problem) -> dict[str, Callable[..., object]]:
    """The vendor kernels to beat, called as ``fn(a, b, c)`` (a scaled fp8 problem: ``fn(a, b, scale_a, scale_b,
    c)``): cuBLAS through torch."""
    import torch

    if problem.scaling:
        return gemm_fp8.scaled_baselines(problem)
    if problem.dtype in ("bf16", "fp16", "fp32"):
        return {"torch.matmul": lambda a, b, c: torch.matmul(a, b, out=c)}
    if problem.dtype == "int8":
        # cuBLASLt's int8 path: a row-major (m, k), b column-major (k, n), int32 out. It refuses
        # m <= 16, so there a user pads A to 32 rows: that is the baseline to beat.
        if problem.m > 16:
            return {"torch._int_mm": lambda a, b, c: torch._int_mm(a, b, out=c)}
        pad: dict[str, Any] = {}

        def padded(a: Any, b: Any, c: Any) -> object:
            if "a" not in pad:
                pad["a"] = torch.zeros((32, a.shape[1]), dtype=a.dtype, device=a.device)
                pad["c"] = torch.empty((32, c.shape[1]), dtype=c.dtype, device=c.device)
            pad["a"][: a.shape[0]].copy_(a)
            torch._int_mm(pad["a"], b, out=pad["c"])
            return c.copy_(pad["c"][: c.shape[0]])

        return {"torch._int_mm (A padded to 32 rows)": padded}
    if problem.dtype == "fp8":
        one = torch.ones((), device="cuda", dtype=torch.float32)
        return {"torch._scaled_mm": lambda a, b, c: c.copy_(
            torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=c.dtype))}
    return {}


CPU_TOLERANCE = 1e-9  # relative Frobenius-norm error allowed against the float64 reference a @ b


class GemmWorkload(Workload):
    kind = "gemm"
    fields = ("m", "n", "k", "dtype", "layout", "scaling")

    def parse(self, table: dict[str, Any]) -> Problem:
        m, n, k = (int_field(table, d) for d in ("m", "n", "k"))
        dtype = choice_field(table, "dtype", "bf16", DTYPES)
        layout = choice_field(table, "layout", "tn", LAYOUTS)
        scaling = choice_field(table, "scaling", "", SCALINGS) if "scaling" in table else ""
        return Problem.gemm(m, n, k, dtype, layout, scaling)  # the scaling's own rules raise a FieldError

    def key(self, problem: Problem) -> str:
        scaled = f"_{problem.scaling}scaled" if problem.scaling else ""
        return f"gemm_{problem.dtype}_{problem.layout}_{problem.m}x{problem.n}x{problem.k}{scaled}"

    def bucket(self, problem: Problem) -> Problem:
        """M, N and K each to the nearest power of two (multiples of 128 stay multiples: block scaling holds)."""
        def r(x: int) -> int:
            return 1 << max(0, round(math.log2(x)))
        return replace(problem, m=r(problem.m), n=r(problem.n), k=r(problem.k))

    def family(self, problem: Problem) -> tuple[Any, ...]:
        return (problem.kind, problem.dtype, problem.layout, problem.scaling)

    def bucket_distance(self, a: Problem, b: Problem) -> float:
        return sum(abs(math.log2(x) - math.log2(y)) for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k)))

    def flops(self, problem: Problem) -> int | None:
        return 2 * problem.m * problem.n * problem.k

    def min_bytes(self, problem: Problem) -> int | None:
        scales = 0
        if problem.scaling:
            scales = 4 * sum(math.prod(shape) for shape in gemm_fp8.scale_shapes(problem))
        return ((problem.m * problem.k + problem.n * problem.k) * problem.in_bytes
                + problem.m * problem.n * problem.out_bytes + scales)

    def describe(self, problem: Problem) -> str:
        scaled = f" {problem.scaling}-scaled" if problem.scaling else ""
        return f"{problem.m}x{problem.n}x{problem.k} {problem.dtype}{scaled} {problem.layout}"

    def to_dict(self, problem: Problem) -> dict[str, Any]:
        return {"kind": "gemm", "m": problem.m, "n": problem.n, "k": problem.k, "dtype": problem.dtype,
                "layout": problem.layout, "label": problem.label, "extra": dict(problem.extra)}

    # -- GPU: the functions of this module, with the kernel called as kernel(a, b, c) (kernel(a, b, scale_a,
    # scale_b, c) for a scaled fp8 problem)
    def make_inputs(self, problem: Problem, seed: int = 0, fill: bool = True) -> tuple[Any, ...]:
        return make_inputs(problem, seed=seed, fill=fill)

    def poison(self, inputs: tuple[Any, ...]) -> None:
        poison(inputs[-1])

    def verify(self, problem: Problem, inputs: tuple[Any, ...]) -> tuple[bool, float, str]:
        if problem.scaling:
            return gemm_fp8.verify_scaled(problem, inputs)
        a, b, c = inputs
        return verify(problem, a, b, c)

    def baselines(self, problem: Problem) -> dict[str, Callable[..., object]]:
        return baselines(problem)

    # -- CPU: fn(a, b) -> c on float64 arrays (fn(a, b, scale_a, scale_b) -> c for a scaled fp8 problem)
    def cpu_inputs(self, problem: Problem, seed: int) -> tuple[Any, ...]:
        import numpy as np

        if problem.scaling:
            return gemm_fp8.cpu_inputs(problem, seed)
        rng = np.random.default_rng(seed)
        return rng.standard_normal((problem.m, problem.k)), rng.standard_normal((problem.k, problem.n))

    def cpu_verify(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> tuple[bool, float | None, str]:
        if problem.scaling:
            return relative_error_check(out, gemm_fp8.cpu_reference(problem, inputs), CPU_TOLERANCE)
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
