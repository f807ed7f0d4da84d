"""Where a benchmark's Triton kernels run: the GPU, or the CPU through Triton's interpreter (``TRITON_INTERPRET=1``,
the CPU tests' tiny runs), and the synchronisation a wall-clock time needs on the GPU."""

from __future__ import annotations

import os


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not interpreted() else "cpu"


def sync() -> None:
    import torch

    if device() == "cuda":
        torch.cuda.synchronize()
