"""Scaled fp8 GEMMs: ``C = (A x scale_a) @ (B x scale_b)``, e4m3 inputs, fp32 scales, bf16 output.

A GEMM problem with ``dtype = "fp8"`` and a ``scaling`` (layout ``tn``) is one of these. The scaling says how
the fp32 scales that dequantize the e4m3 numbers are laid out (``SCALE_BLOCK`` is 128):

* ``tensor``: ``scale_a`` and ``scale_b`` are scalars (shape ``()``);
* ``row``: ``scale_a`` (M, 1), one per row of A (per token), and ``scale_b`` (1, N), one per row of the (N, K)
  weights (per output channel): what ``torch._scaled_mm`` takes for rowwise scaling;
* ``block``: ``scale_a`` (M, K/128), one per 1x128 group of a row of A along K (per token group), and
  ``scale_b`` (N/128, K/128), one per 128x128 block of the (N, K) weights: the layout of vLLM's block-fp8
  linear layers (DeepSeek-V3 style checkpoints).

A kernel is called ``kernel(a, b, scale_a, scale_b, c)``: ``a`` (M, K) row-major e4m3, ``b`` the (K, N) view of
the (N, K) row-major e4m3 weights, the scales contiguous as above, ``c`` (M, N) bf16 row-major (poisoned with
NaN before each checked launch). On the CPU oracle ``fn(a, b, scale_a, scale_b) -> c`` takes float64 numpy
arrays holding the same e4m3 values and scales.

The inputs are made as a deployment makes them: random activations (rows of different magnitude, a few outlier
channels) and weights (of different magnitudes per output channel and per band of 128 rows or columns),
quantized with amax-based scales: each group's scale is its largest magnitude over 448, e4m3's largest finite
value, so that the group's largest number maps to 448. Scales that vary along their axes are what makes a
kernel that applies one along the wrong axis fail.

The reference is the dequantized product in fp32 (TF32 off), exact but for fp32 accumulation; a kernel passes
when its relative Frobenius-norm error is at most :data:`SCALED_TOLERANCE`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evotune.core.problem import SCALE_BLOCK, Problem

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
# the bf16 output rounds each element by up to 2**-9 relative (about 1e-3 as a Frobenius norm); fp32
# accumulation adds far less, and the FP8 tensor cores' narrower accumulator a few 1e-3 at long K. A scale
# applied along a wrong axis or to a wrong group is off by the spread of the scales: O(1).
SCALED_TOLERANCE = 1e-2
OUTLIER_CHANNELS = 0.01  # share of A's K channels 10x larger than the rest, as LLM activations have
OUTLIER_GAIN = 10.0
WEIGHT_BAND_SPREAD = 0.5  # log-normal spread of the weights' magnitude between bands of 128 rows or columns


def scale_groups(problem: Problem) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, columns) of the group that one scale covers, of A (M, K) and of the weights B (N, K)."""
    m, n, k = problem.m, problem.n, problem.k
    return {"tensor": ((m, k), (n, k)), "row": ((1, k), (1, k)),
            "block": ((1, SCALE_BLOCK), (SCALE_BLOCK, SCALE_BLOCK))}[problem.scaling]


def scale_shapes(problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of ``scale_a`` and ``scale_b`` a kernel is given."""
    m, n, k = problem.m, problem.n, problem.k
    return {"tensor": ((), ()), "row": ((m, 1), (1, n)),
            "block": ((m, k // SCALE_BLOCK), (n // SCALE_BLOCK, k // SCALE_BLOCK))}[problem.scaling]


def describe_scaling(scaling: str) -> str:
    return {"tensor": "per-tensor scales", "row": "per-row scales",
            "block": f"1x{SCALE_BLOCK} and {SCALE_BLOCK}x{SCALE_BLOCK} block scales"}[scaling]


# -- torch (the GPU worker; any device) -------------------------------------------
def quantize(x: Any, group: tuple[int, int]) -> tuple[Any, Any]:
    """``x`` (R, C) as e4m3 and its fp32 scales, one per ``group`` of rows x columns: (R/gr, C/gc)."""
    import torch

    rows, cols = x.shape
    gr, gc = group
    xf = x.float().reshape(rows // gr, gr, cols // gc, gc)
    amax = xf.abs().amax(dim=(1, 3)).clamp_min(torch.finfo(torch.float32).tiny)
    scale = amax / E4M3_MAX
    q = (xf / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(rows, cols), scale


def expand(scale: Any, group: tuple[int, int], rows: int, cols: int) -> Any:
    """A (rows/gr, cols/gc) grid of scales as a (rows, cols) tensor, each scale over its group."""
    return scale.reshape(rows // group[0], cols // group[1]).repeat_interleave(group[0], 0) \
        .repeat_interleave(group[1], 1)


def scaled_inputs(problem: Problem, seed: int = 0, fill: bool = True, device: str = "cuda") -> tuple[Any, ...]:
    """``(a, b, scale_a, scale_b, c)`` (see the module docstring); ``fill=False`` only allocates them."""
    import torch

    m, n, k = problem.m, problem.n, problem.k
    sa_shape, sb_shape = scale_shapes(problem)
    c = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    if not fill:
        fp8 = torch.float8_e4m3fn
        return (torch.empty((m, k), dtype=fp8, device=device), torch.empty((n, k), dtype=fp8, device=device).t(),
                torch.empty(sa_shape, device=device), torch.empty(sb_shape, device=device), c)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape: int) -> Any:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32)

    # tokens of different norms, and a few channels far larger than the rest
    outliers = torch.rand((k,), generator=gen, device=device) < OUTLIER_CHANNELS
    channel = 1.0 + (OUTLIER_GAIN - 1.0) * outliers.float()
    x = (randn(m, k) * torch.exp(0.5 * randn(m, 1)) * channel).to(torch.bfloat16)
    # at the size of a trained layer's weights, of different magnitudes per output channel and per region
    bands_n = torch.exp(WEIGHT_BAND_SPREAD * randn(-(-n // SCALE_BLOCK), 1)).repeat_interleave(SCALE_BLOCK, 0)[:n]
    bands_k = torch.exp(WEIGHT_BAND_SPREAD * randn(1, -(-k // SCALE_BLOCK))).repeat_interleave(SCALE_BLOCK, 1)[:, :k]
    w = (randn(n, k) * 0.02 * torch.exp(0.25 * randn(n, 1)) * bands_n * bands_k).to(torch.bfloat16)
    ga, gb = scale_groups(problem)
    a, scale_a = quantize(x, ga)
    wq, scale_b = quantize(w, gb)
    c.fill_(float("nan"))
    return a, wq.t(), scale_a.reshape(sa_shape).contiguous(), scale_b.reshape(sb_shape).contiguous(), c


def scaled_reference(problem: Problem, a: Any, b: Any, scale_a: Any, scale_b: Any) -> Any:
    """The dequantized product in fp32, without TF32."""
    import torch

    m, n, k = problem.m, problem.n, problem.k
    ga, gb = scale_groups(problem)
    a_deq = a.float() * expand(scale_a, ga, m, k)
    b_deq = b.float() * expand(scale_b, gb, n, k).t()  # b is the (K, N) view of the (N, K) weights
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return a_deq @ b_deq
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def verify_scaled(problem: Problem, inputs: tuple[Any, ...]) -> tuple[bool, float, str]:
    """(passed, relative error, why not) of ``c`` against the dequantized product."""
    import torch

    a, b, scale_a, scale_b, c = inputs
    ref = scaled_reference(problem, a, b, scale_a, scale_b)
    out = c.float()
    if not torch.isfinite(out).all():
        bad = int((~torch.isfinite(out)).sum())
        return False, float("inf"), f"{bad} output elements are NaN/inf (unwritten or overflowed)"
    err = float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))
    if err > SCALED_TOLERANCE:
        return False, err, (f"relative error {err:.3g} exceeds {SCALED_TOLERANCE:g} for fp8 with "
                            f"{describe_scaling(problem.scaling)}")
    return True, err, ""


def scaled_baselines(problem: Problem) -> dict[str, Callable[..., object]]:
    """cuBLAS through torch with the problem's scaling: ``torch._scaled_mm`` for tensor and row scales; for block
    scales, which ``torch._scaled_mm`` refuses, ``torch.nn.functional.scaled_mm`` (torch 2.9 and newer: its
    1x128-by-128x128 recipe, sm_90 with cuBLAS 12.9 or newer; where torch refuses it, the baseline's error is
    recorded). The block-fp8 Triton family names vLLM's default configuration as a baseline of its own."""
    import torch

    if problem.scaling in ("tensor", "row"):
        def scaled_mm(a: Any, b: Any, scale_a: Any, scale_b: Any, c: Any) -> object:
            return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=c.dtype, out=c)

        return {f"torch._scaled_mm ({describe_scaling(problem.scaling)})": scaled_mm}
    functional = torch.nn.functional
    if not hasattr(functional, "scaled_mm"):
        return {}
    recipe = functional.ScalingType

    def blockwise(a: Any, b: Any, scale_a: Any, scale_b: Any, c: Any) -> object:
        out = functional.scaled_mm(a, b, scale_a, recipe.BlockWise1x128, scale_b, recipe.BlockWise128x128,
                                   output_dtype=c.dtype)
        return c.copy_(out)  # it takes no output tensor: the copy is part of what a caller pays

    blockwise.prepare = blockwise_scales  # type: ignore[attr-defined]
    return {f"torch.nn.functional.scaled_mm ({describe_scaling('block')})": blockwise}


def blockwise_scales(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The inputs with the scales laid out as cuBLAS's block-scaled GEMM reads them (once, outside the timing, as
    a deployment stores them): ``scale_a`` (M, K/128) column-major, ``scale_b`` the (K/128 rounded up to 4,
    N/128) view of the (N/128, K/128) scales padded along K."""
    import torch

    a, b, scale_a, scale_b, c = inputs
    groups = scale_b.shape[1]
    padded = torch.ones((scale_b.shape[0], -(-groups // 4) * 4), dtype=scale_b.dtype, device=scale_b.device)
    padded[:, :groups] = scale_b
    return a, b, scale_a.t().contiguous().t(), padded.t(), c


# -- numpy (the CPU oracle) ----------------------------------------------------------
def round_e4m3(x: Any) -> Any:
    """``x`` (float64, within +-448) rounded to the nearest float8_e4m3fn value, ties to even: 3 mantissa bits,
    exponents down to -6, subnormal steps of 2**-9 below that."""
    import numpy as np

    with np.errstate(divide="ignore"):
        exponent = np.maximum(np.floor(np.log2(np.abs(x))), -6.0)
    step = np.exp2(exponent - 3)
    return np.clip(np.round(x / step) * step, -E4M3_MAX, E4M3_MAX)


def quantize_np(x: Any, group: tuple[int, int]) -> tuple[Any, Any]:
    """:func:`quantize` on float64 numpy arrays: e4m3 values (as float64) and float32 scales."""
    import numpy as np

    rows, cols = x.shape
    gr, gc = group
    xg = x.reshape(rows // gr, gr, cols // gc, gc)
    amax = np.maximum(np.abs(xg).max(axis=(1, 3)), np.finfo(np.float32).tiny)
    scale = (amax / E4M3_MAX).astype(np.float32)
    q = round_e4m3(np.clip(xg / scale.astype(np.float64)[:, None, :, None], -E4M3_MAX, E4M3_MAX))
    return q.reshape(rows, cols), scale


def expand_np(scale: Any, group: tuple[int, int], rows: int, cols: int) -> Any:
    import numpy as np

    grid = np.asarray(scale, dtype=np.float64).reshape(rows // group[0], cols // group[1])
    return np.repeat(np.repeat(grid, group[0], axis=0), group[1], axis=1)


def cpu_inputs(problem: Problem, seed: int) -> tuple[Any, ...]:
    """``(a (M, K), b (K, N), scale_a, scale_b)``: float64 arrays of e4m3 values, float32 scales shaped as on the
    GPU."""
    import numpy as np

    rng = np.random.default_rng(seed)
    m, n, k = problem.m, problem.n, problem.k
    channel = np.where(rng.random(k) < OUTLIER_CHANNELS, OUTLIER_GAIN, 1.0)
    x = rng.standard_normal((m, k)) * np.exp(0.5 * rng.standard_normal((m, 1))) * channel
    bands_n = np.repeat(np.exp(WEIGHT_BAND_SPREAD * rng.standard_normal((-(-n // SCALE_BLOCK), 1))), SCALE_BLOCK, 0)
    bands_k = np.repeat(np.exp(WEIGHT_BAND_SPREAD * rng.standard_normal((1, -(-k // SCALE_BLOCK)))), SCALE_BLOCK, 1)
    w = rng.standard_normal((n, k)) * 0.02 * np.exp(0.25 * rng.standard_normal((n, 1))) * bands_n[:n] * bands_k[:, :k]
    ga, gb = scale_groups(problem)
    sa_shape, sb_shape = scale_shapes(problem)
    a, scale_a = quantize_np(x, ga)
    wq, scale_b = quantize_np(w, gb)
    return a, wq.T.copy(), scale_a.reshape(sa_shape), scale_b.reshape(sb_shape)


def cpu_reference(problem: Problem, inputs: tuple[Any, ...]) -> Any:
    """The dequantized product in float64."""
    a, b, scale_a, scale_b = inputs
    m, n, k = problem.m, problem.n, problem.k
    ga, gb = scale_groups(problem)
    return (a * expand_np(scale_a, ga, m, k)) @ (b * expand_np(scale_b, gb, n, k).T)
