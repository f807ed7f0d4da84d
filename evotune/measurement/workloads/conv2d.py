"""The conv2d forward (fprop) workload: ``y = conv2d(x, w)`` with padding, stride and dilation.

Fields of a ``[[problem]]`` table with ``kind = "conv2d"``: ``N, C, H, W`` (the
input), ``K, R, S`` (filters: count, height, width), ``pad``, ``stride``,
``dilation`` (the same for height and width), ``dtype`` and ``layout``, and for
int8 ``scaling``.

* ``dtype``: ``int8`` (int8 inputs, exact int32 accumulation, int8 output after
  ``clip(rint(acc * scale), -128, 127)`` with an fp32 scale per tensor or per
  output channel, ``scaling = "tensor"`` or ``"channel"``), ``fp16`` or ``bf16``
  (fp32 accumulation, output in the input dtype).
* ``layout``: ``nhwc`` (x ``(N, H, W, C)``, w ``(K, R, S, C)``, y ``(N, P, Q, K)``)
  or ``nc32hw32``, NC/32HW32 (x ``(N, C/32, H, W, 32)``, w ``(K, C/32, R, S, 32)``,
  y ``(N, K/32, P, Q, 32)``), int8 only, C and K multiples of 32.

A kernel is called ``kernel(x, w, y)``, or ``kernel(x, w, scale, y)`` for int8
(``scale`` fp32 of shape ``(1,)`` or ``(K,)``), every tensor contiguous in the
problem's layout; on the CPU oracle ``fn(x, w) -> y`` or ``fn(x, w, scale) -> y``
on numpy arrays (bf16 as float32 arrays holding bf16 values: numpy has no bf16).

Example::

    from evotune.core.problem import get_workload
    conv = get_workload("conv2d")
    p = conv.parse({"N": 10, "C": 128, "H": 72, "W": 120, "K": 128, "R": 3, "S": 3, "pad": 1,
                    "dtype": "int8", "layout": "nc32hw32"})
    p.key     # 'conv2d_int8_nc32hw32_n10c128h72w120k128r3s3_p1s1d1'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from evotune.core.problem import FieldError, Problem, Workload, choice_field, int_field
from evotune.measurement.workloads.conv2d_shape import VECT, ConvShape, physical_shape, to_layout, to_nhwc

DTYPES = ("int8", "fp16", "bf16")
LAYOUTS = ("nhwc", "nc32hw32")
SCALINGS = ("tensor", "channel")
# relative Frobenius-norm error allowed for float outputs (fp32 accumulate, output rounded to the dtype)
TOLERANCE = {"fp16": 5e-3, "bf16": 2e-2}
INT8_POISON = -128  # an unwritten int8 output keeps it; with the scales below a true -128 is rare
INT8_TOLERANCE = 1  # an int8 output may differ by one step: the scale multiply rounds differently in fp32
_SIZES = ("N", "C", "H", "W", "K", "R", "S")


class Conv2dWorkload(Workload):
    kind = "conv2d"
    fields = (*_SIZES, "pad", "stride", "dilation", "dtype", "layout", "scaling")

    def parse(self, table: dict[str, Any]) -> Problem:
        sizes = {name: int_field(table, name, None, 1) for name in _SIZES}
        pad = int_field(table, "pad", 0, 0)
        stride = int_field(table, "stride", 1, 1)
        dilation = int_field(table, "dilation", 1, 1)
        dtype = choice_field(table, "dtype", "fp16", DTYPES)
        layout = choice_field(table, "layout", "nhwc", LAYOUTS)
        if layout == "nc32hw32":
            if dtype != "int8":
                raise FieldError("layout", f"nc32hw32 holds int8 only, not {dtype}")
            for name in ("C", "K"):
                if sizes[name] % VECT:
                    raise FieldError(name, f"must be a multiple of {VECT} for layout nc32hw32, got {sizes[name]}")
        scaling = table.get("scaling", "tensor" if dtype == "int8" else "")
        if dtype != "int8" and "scaling" in table:
            raise FieldError("scaling", f"only int8 outputs are scaled, not {dtype}")
        if dtype == "int8" and scaling not in SCALINGS:
            raise FieldError("scaling", f"unknown scaling {scaling!r}; accepted: {', '.join(SCALINGS)}")
        shape = ConvShape(**sizes, pad=pad, stride=stride, dilation=dilation, scaling=scaling)
        for out, size, filt, name in (("P", "H", "R", "R"), ("Q", "W", "S", "S")):
            if getattr(shape, out) < 1:
                raise FieldError(name, f"a filter of {sizes[filt]} with dilation {dilation} does not fit "
                                       f"{size} = {sizes[size]} padded by {pad} on each side")
        return shape.problem(dtype, layout)

    def key(self, problem: Problem) -> str:
        s = ConvShape.of(problem)
        scaled = "_perchannel" if s.scaling == "channel" else ""
        return (f"conv2d_{problem.dtype}_{problem.layout}_n{s.N}c{s.C}h{s.H}w{s.W}k{s.K}r{s.R}s{s.S}"
                f"_p{s.pad}s{s.stride}d{s.dilation}{scaled}")

    def bucket(self, problem: Problem) -> Problem:
        """N, C, H, W and K each rounded to the nearest power of two; the filter and its steps kept."""
        s = ConvShape.of(problem)

        def r(x: int) -> int:
            return 1 << max(0, round(math.log2(x)))
        b = ConvShape(r(s.N), r(s.C), r(s.H), r(s.W), r(s.K), s.R, s.S, s.pad, s.stride, s.dilation, s.scaling)
        return b.problem(problem.dtype, problem.layout)

    def family(self, problem: Problem) -> tuple[Any, ...]:
        s = ConvShape.of(problem)
        return (problem.kind, problem.dtype, problem.layout, s.R, s.S, s.pad, s.stride, s.dilation, s.scaling)

    def bucket_distance(self, a: Problem, b: Problem) -> float:
        sa, sb = ConvShape.of(a), ConvShape.of(b)
        return sum(abs(math.log2(getattr(sa, d)) - math.log2(getattr(sb, d))) for d in ("N", "C", "H", "W", "K"))

    def flops(self, problem: Problem) -> int | None:
        s = ConvShape.of(problem)
        return 2 * s.N * s.K * s.P * s.Q * s.C * s.R * s.S

    def min_bytes(self, problem: Problem) -> int | None:
        s = ConvShape.of(problem)
        elem = 1 if problem.dtype == "int8" else 2  # inputs and output alike
        scales = 4 * (s.K if s.scaling == "channel" else 1) if problem.dtype == "int8" else 0
        return (s.N * s.C * s.H * s.W + s.K * s.C * s.R * s.S + s.N * s.K * s.P * s.Q) * elem + scales

    def describe(self, problem: Problem) -> str:
        s = ConvShape.of(problem)
        scaled = f" {s.scaling} scale" if s.scaling else ""
        return (f"conv2d N{s.N} C{s.C} H{s.H} W{s.W} K{s.K} R{s.R} S{s.S} pad {s.pad} stride {s.stride} "
                f"dilation {s.dilation} {problem.dtype} {problem.layout}{scaled}")

    # -- GPU (torch): see the module docstring for the launch convention; tests/test_gpu_conv.py runs it
    def make_inputs(self, problem: Problem, seed: int = 0, fill: bool = True) -> tuple[Any, ...]:
        import torch

        s, layout = ConvShape.of(problem), problem.layout
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        dt = {"int8": torch.int8, "fp16": torch.float16, "bf16": torch.bfloat16}[problem.dtype]

        def tensor(shape: tuple[int, ...]) -> Any:
            if not fill:
                return torch.empty(shape, dtype=dt, device="cuda")
            if dt == torch.int8:
                return torch.randint(-8, 8, shape, generator=gen, device="cuda", dtype=torch.int8)
            return (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * 0.5).to(dt)

        x = tensor(physical_shape((s.N, s.H, s.W, s.C), layout))
        w = tensor(physical_shape((s.K, s.R, s.S, s.C), layout))
        y = torch.empty(physical_shape((s.N, s.P, s.Q, s.K), layout), dtype=dt, device="cuda")
        if fill:
            self.poison((y,))
        if problem.dtype != "int8":
            return x, w, y
        base = _int8_scale(s)
        if s.scaling == "channel":
            factor = torch.rand((s.K,), generator=gen, device="cuda", dtype=torch.float32) + 0.5
            scale = factor * base
        else:
            scale = torch.full((1,), base, device="cuda", dtype=torch.float32)
        return x, w, scale, y

    def poison(self, inputs: tuple[Any, ...]) -> None:
        y = inputs[-1]
        y.fill_(float("nan") if y.dtype.is_floating_point else INT8_POISON)

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        """The expected output in NHWC, float64 (int8: the exact accumulation, scaled, rounded and clipped)."""
        import torch
        import torch.nn.functional as F

        s = ConvShape.of(problem)
        x, w = (to_nhwc(t, problem.layout).permute(0, 3, 1, 2) for t in inputs[:2])
        if problem.dtype == "int8":
            # exact either way: float32 while no partial sum can reach 2^24 (fast, cuDNN), float64 beyond
            bound = float(x.abs().max()) * float(w.abs().max()) * s.C * s.R * s.S
            wide = torch.float32 if bound < 2 ** 24 else torch.float64
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                acc = F.conv2d(x.to(wide), w.to(wide), stride=s.stride, padding=s.pad, dilation=s.dilation)
            scale = inputs[2].double().view(1, -1, 1, 1)
            return torch.clamp(torch.round(acc.double() * scale), -128, 127).permute(0, 2, 3, 1)
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            out = F.conv2d(x.float(), w.float(), stride=s.stride, padding=s.pad, dilation=s.dilation)
        return out.double().permute(0, 2, 3, 1)

    def verify(self, problem: Problem, inputs: tuple[Any, ...]) -> tuple[bool, float, str]:
        import torch

        ref = self.reference(problem, inputs)
        out = to_nhwc(inputs[-1], problem.layout).double()
        if problem.dtype == "int8":
            diff = (out - ref).abs()
            wrong = int((diff > INT8_TOLERANCE).sum())
            worst = float(diff.max()) if diff.numel() else 0.0
            if wrong:
                return False, worst, (f"{wrong} of {out.numel()} int8 outputs differ from the scaled exact "
                                      f"convolution by more than {INT8_TOLERANCE}")
            return True, worst, ""
        if not torch.isfinite(out).all():
            bad = int((~torch.isfinite(out)).sum())
            return False, float("inf"), f"{bad} output elements are NaN/inf (unwritten or overflowed)"
        err = float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))
        tol = TOLERANCE[problem.dtype]
        if err > tol:
            return False, err, f"relative error {err:.3g} exceeds {tol:g} for {problem.dtype}"
        return True, err, ""

    def baselines(self, problem: Problem) -> dict[str, Callable[..., object]]:
        """cuDNN in fp16 through torch (channels_last; for int8 problems the same shape in fp16) and, for int8,
        cuDNN's int8 convolution through the cuDNN frontend (:mod:`evotune.measurement.workloads.conv2d_baselines`)."""
        from evotune.measurement.workloads import conv2d_baselines as cb

        name = "fp16" if problem.dtype in ("int8", "fp16") else problem.dtype
        out = {f"cudnn {name} conv2d (torch, channels_last)": cb.cudnn_fp16(problem)}
        if problem.dtype == "int8":
            out["cudnn int8 conv2d (frontend graph)"] = cb.cudnn_int8(problem)
        return out

    # -- CPU (numpy)
    def cpu_inputs(self, problem: Problem, seed: int) -> tuple[Any, ...]:
        import numpy as np

        s, rng = ConvShape.of(problem), np.random.default_rng(seed)

        def tensor(shape: tuple[int, ...]) -> Any:
            if problem.dtype == "int8":
                return rng.integers(-8, 8, shape, dtype=np.int8)
            values = (rng.standard_normal(shape) * 0.5).astype(np.float32)
            return values.astype(np.float16) if problem.dtype == "fp16" else _bf16_values(values)

        x = to_layout(tensor((s.N, s.H, s.W, s.C)), problem.layout)
        w = to_layout(tensor((s.K, s.R, s.S, s.C)), problem.layout)
        if problem.dtype != "int8":
            return x, w
        base = _int8_scale(s)
        factor = rng.uniform(0.5, 1.5, s.K) if s.scaling == "channel" else np.ones(1)
        return x, w, (factor * base).astype(np.float32)

    def cpu_reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        """The expected output in the problem's layout: int8 (exact int64 accumulation, then the scaling) or
        float64."""
        import numpy as np

        s = ConvShape.of(problem)
        x, w = (to_nhwc(t, problem.layout) for t in inputs[:2])
        wide = np.int64 if problem.dtype == "int8" else np.float64
        acc = conv2d_nhwc(x.astype(wide), w.astype(wide), s.pad, s.stride, s.dilation)
        if problem.dtype == "int8":
            acc = np.clip(np.rint(acc * inputs[2].astype(np.float64)), -128, 127).astype(np.int8)
        return to_layout(acc, problem.layout)

    def cpu_verify(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> tuple[bool, float | None, str]:
        import numpy as np

        from evotune.measurement.workloads.gemm import relative_error_check

        ref = self.cpu_reference(problem, inputs)
        if problem.dtype != "int8":
            return relative_error_check(out, ref, TOLERANCE[problem.dtype])
        if not isinstance(out, np.ndarray):
            return False, None, f"returned {type(out).__name__}, not an array"
        if out.shape != ref.shape:
            return False, None, f"shape {out.shape}, expected {ref.shape}"
        if out.dtype != np.int8:
            return False, None, f"dtype {out.dtype}, expected int8"
        diff = np.abs(out.astype(np.int64) - ref.astype(np.int64))
        wrong = int((diff > INT8_TOLERANCE).sum())
        if wrong:
            return False, float(diff.max()), (f"{wrong} of {out.size} int8 outputs differ from the scaled exact "
                                              f"convolution by more than {INT8_TOLERANCE}")
        return True, float(diff.max()) if diff.size else 0.0, ""


def conv2d_nhwc(x: Any, w: Any, pad: int, stride: int, dilation: int) -> Any:
    """Direct convolution in numpy: x ``(N, H, W, C)``, w ``(K, R, S, C)`` -> ``(N, P, Q, K)``, in x's dtype."""
    import numpy as np

    n, h, wd, _ = x.shape
    k, r_, s_, _ = w.shape
    p = (h + 2 * pad - dilation * (r_ - 1) - 1) // stride + 1
    q = (wd + 2 * pad - dilation * (s_ - 1) - 1) // stride + 1
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    out = np.zeros((n, p, q, k), dtype=x.dtype)
    for r in range(r_):
        for s in range(s_):
            patch = xp[:, r * dilation: r * dilation + stride * (p - 1) + 1: stride,
                       s * dilation: s * dilation + stride * (q - 1) + 1: stride, :]
            out += np.tensordot(patch, w[:, r, s, :], axes=([3], [1]))
    return out


def _int8_scale(s: ConvShape) -> float:
    """A scale that maps the accumulation of random int8 data in [-8, 8) to a spread of about +-32 (E[v^2] =
    21.5 per operand), so that clipping, and an output equal to the poison value, are rare."""
    return 32.0 / (21.5 * math.sqrt(s.C * s.R * s.S))


def _bf16_values(x: Any) -> Any:
    """float32 values rounded to the nearest bf16 (numpy has no bf16 type): kept as float32."""
    import numpy as np

    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


WORKLOAD = Conv2dWorkload()
