"""The fused-MoE kernel's launch grid from its key, for ``autotune_replay.py --grid``, without torch or a routing.

The kernel (``search_spaces/_triton_fused_moe.py``) runs one program per ``BLOCK_SIZE_M`` block of an expert's
routed slots and ``BLOCK_SIZE_N`` columns; each expert's slots are padded to a multiple of the block. The real
launch counts the blocks of its own routing; from the key alone the routing is taken as even (``M x TOP_K`` slots,
the same share for each expert that gets one; fewer slots than experts leave the rest empty), which is what a random
routing of many tokens tends to::

    python benchmarks/autotune_replay.py --landscapes evotune/landscapes/autotune_moe \\
        --grid benchmarks/fused_moe_grid.py:grid --sms 132
"""

from __future__ import annotations

import math
from collections.abc import Callable

TOP_K = 2  # experts per token of the shipped landscapes' model (Mixtral 8x7B)


def grid(M: int, N: int, E: int) -> Callable[[dict[str, int]], tuple[int]]:
    """The grid of a launch at ``M`` tokens, ``N`` output columns and ``E`` experts, as a function of the META dict."""
    slots = M * TOP_K
    experts = min(E, slots)  # the experts routed a slot

    def of(meta: dict[str, int]) -> tuple[int]:
        blocks = experts * math.ceil(slots / experts / meta["BLOCK_SIZE_M"])
        return (blocks * math.ceil(N / meta["BLOCK_SIZE_N"]),)

    return of
