"""A Triton matmul tuned by ``evotune.autotune``, with ``torch.matmul`` as its reference.

``matmul(a, b)`` launches the kernel exactly as under ``triton.autotune`` (the
decorator is the only line that differs); ``make_args`` builds a key's launch for
``python -m evotune tune-kernel`` (see ``keys.toml`` beside this file)::

    python -m evotune tune-kernel examples/triton_autotune/matmul.py:matmul_kernel \\
        --keys examples/triton_autotune/keys.toml

Run it on a GPU (``python examples/triton_autotune/matmul.py``) or on the CPU
through the Triton interpreter (``TRITON_INTERPRET=1``, tiny shapes).
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

import evotune
from search_spaces._triton_matmul_example import grid, launch_args, make_args, matmul_body

#: a small list: no longer than the budget, so it is timed whole, as triton.autotune does
CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (128, 256, 64, 8, 3), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 2, 5), (32, 64, 32, 2, 5),
        (128, 128, 64, 8, 3), (256, 128, 64, 8, 3), (64, 64, 64, 4, 3), (32, 32, 32, 2, 2),
    ]
]


@evotune.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    matmul_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


def matmul(a: torch.Tensor, b: torch.Tensor, kernel=matmul_kernel) -> torch.Tensor:
    c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype)
    kernel[grid(a.shape[0], b.shape[1])](*launch_args(a, b, c))
    return c


__all__ = ["CONFIGS", "grid", "launch_args", "make_args", "matmul", "matmul_body", "matmul_kernel"]


if __name__ == "__main__":
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        print("matmul.py: no GPU found: set TRITON_INTERPRET=1 to run on the CPU through Triton's interpreter",
              file=sys.stderr)
        raise SystemExit(2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = 1024 if device == "cuda" else 32
    dt = torch.float16 if device == "cuda" else torch.float32
    a, b = torch.randn(size, size, device=device, dtype=dt), torch.randn(size, size, device=device, dtype=dt)
    c = matmul(a, b)
    err = (c.float() - a.float() @ b.float()).abs().max().item()
    print(f"matmul {size}^3 {dt}: max abs error vs torch {err:.3g}; chosen: {matmul_kernel.best_config}")
