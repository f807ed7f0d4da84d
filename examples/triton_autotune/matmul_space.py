"""The matmul of ``matmul.py`` tuned over a space of configurations instead of a list (the space and the plain
kernel are shipped with evotune, in ``search_spaces/_triton_matmul_example.py``: ``tune-model`` tunes them).

``SPACE`` and its named constraints (shared memory, accumulator registers, warps for the tile) are described
there. None of them reads the problem's shape, so every shape has the same feasible set (a sample drawn once serves
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
