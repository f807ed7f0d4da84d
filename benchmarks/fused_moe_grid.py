"""The fused-MoE kernel's launch grid and arguments from its key, for ``autotune_replay.py --grid`` and
``--launch``, without torch or a routing.

The kernel (``search_spaces/_triton_fused_moe.py``) runs one program per ``BLOCK_SIZE_M`` block of an expert's
routed slots and ``BLOCK_SIZE_N`` columns; each expert's slots are padded to a multiple of the block. The real
launch counts the blocks of its own routing; from the key alone the routing is taken as even (``M x TOP_K`` slots,
the same share for each expert that gets one; fewer slots than experts leave the rest empty), which is what a random
routing of many tokens tends to::

    python benchmarks/autotune_replay.py --landscapes evotune/landscapes/autotune_moe \\
        --grid benchmarks/fused_moe_grid.py:grid --sms 132

The arguments its space's constraints read (``search_spaces/_triton_fused_moe.py:SPACE``, through ``ctx.args``):
the sizes, ``top_k``, the fp8 scale block and the activations ``a``, of which they read the element size::

    python benchmarks/autotune_replay.py --landscapes evotune/landscapes/autotune_moe \\
        --space search_spaces/_triton_fused_moe.py:SPACE --launch benchmarks/fused_moe_grid.py:launch_args
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

TOP_K = 2  # experts per token of the shipped landscapes' model (Mixtral 8x7B)
#: bytes of an element of each dtype a key names (torch's names)
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
FP8 = "float8_e4m3fn"


def grid(M: int, N: int, E: int) -> Callable[[dict[str, int]], tuple[int]]:
    """The grid of a launch at ``M`` tokens, ``N`` output columns and ``E`` experts, as a function of the META dict."""
    slots = M * TOP_K
    experts = min(E, slots)  # the experts routed a slot

    def of(meta: dict[str, int]) -> tuple[int]:
        blocks = experts * math.ceil(slots / experts / meta["BLOCK_SIZE_M"])
        return (blocks * math.ceil(N / meta["BLOCK_SIZE_N"]),)

    return of


class Operand:
    """The activations as the space's constraints read them: their element size, as a tensor answers it."""

    def __init__(self, dtype: str):
        self.dtype = dtype

    def element_size(self) -> int:
        return ELEMENT_BYTES[self.dtype]


def launch_args(M: int, N: int, K: int, E: int, dtype: str) -> dict[str, Any]:
    """The launch's arguments the space's constraints read, by name, at a key (fp8 scaled per tensor: no scale
    block)."""
    if dtype not in ELEMENT_BYTES:
        raise ValueError(f"dtype {dtype!r} is none of {', '.join(ELEMENT_BYTES)}")
    return {"M": M, "N": N, "K": K, "E": E, "top_k": TOP_K, "FP8": dtype == FP8, "SCALE_BLOCK": 0,
            "a": Operand(dtype)}
