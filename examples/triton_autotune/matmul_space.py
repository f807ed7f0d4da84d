"""The matmul of ``matmul.py`` tuned over a space of configurations instead of a list (the space and the plain
kernel are shipped with evotune, in ``search_spaces/_triton_matmul_example.py``: ``tune-model`` tunes them).

``SPACE``: ``BLOCK_M`` and ``BLOCK_N`` in {16, ..., 256}, ``BLOCK_K`` in {16, ..., 128}, ``GROUP_M`` in
{1, 4, 8}, ``num_warps`` in {2, 4, 8}, ``num_stages`` in {2, 3, 4, 5}: 3,600 points, of which 2,478 are
feasible for fp16 on an H100. Its named constraints read the launch (``ctx.args``: the element size of
``a_ptr``) and the GPU (``ctx.hardware``; the H100's limits when the context names none, as inside
``evotune.autotune``, whose check of each compiled kernel then catches a smaller device's):

* ``shared-memory``: the pipelined A and B tiles, ``num_stages`` x (BLOCK_M + BLOCK_N) x BLOCK_K elements,
  within the shared memory a block may use;
* ``accumulator-registers``: the fp32 accumulator, at most 128 registers a thread;
* ``warps-for-tile``: every warp owns at least one 16 x 16 block of the output tile.

None of them reads the problem's shape, so every shape has the same feasible set (a sample drawn once serves
them all, each kernel compiled once)::

    python -m evotune tune-kernel examples/triton_autotune/matmul_space.py:matmul_space_kernel \\
        --keys examples/triton_autotune/keys.toml
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import evotune
from search_spaces._triton_matmul_example import SPACE, grid, launch_args, make_args, matmul_space_plain, shared_bytes

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # the launch of matmul.py, beside this file
    sys.path.insert(0, HERE)

from matmul import matmul  # noqa: E402

matmul_space_kernel = evotune.autotune(space=SPACE, key=["M", "N", "K"], budget=40)(matmul_space_plain)


def tuned_matmul(a: Any, b: Any) -> Any:
    """``a @ b`` by the kernel tuned over ``SPACE``."""
    return matmul(a, b, kernel=matmul_space_kernel)


__all__ = ["SPACE", "grid", "launch_args", "make_args", "matmul", "matmul_space_kernel", "shared_bytes",
           "tuned_matmul"]
