"""What the oracle's cold-L2 flush costs a short kernel: the same kernels timed after two kinds of flush.

The oracle (``evotune/measurement/oracle.py``) empties the L2 before each sample by overwriting a buffer of
twice its size, as ``triton.testing.do_bench`` does. That leaves the L2 full of dirty lines, which the GPU
writes back to HBM while the timed kernel's first loads evict them. This script times torch.matmul (cuBLAS)
and one CUTLASS sm90 configuration per shape after that flush ("dirty") and after a flush that reads the
buffer instead ("clean": the L2 is as cold, and nothing is left to write back), twice each, interleaved.

Usage (H100, CUTLASS C++ headers and nvcc installed)::

    python3 benchmarks/l2_flush.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from evotune.core.problem import Problem
from evotune.measurement import oracle as om
from evotune.measurement.workloads.gemm import make_inputs
from search_spaces import _cutlass_sm90 as cutlass


class CleanFlush(om.Oracle):
    """The oracle with a flush that reads the 2 x L2 buffer: it evicts the L2 and leaves its lines clean."""

    def sample(self, launch, n):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        torch.cuda._sleep(om.HEAD_START_CYCLES * n)
        for s, e in zip(starts, ends, strict=True):
            self._sink = self._flush.sum(dtype=torch.int64)
            s.record()
            launch()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


SWAPPED = dict(swap_ab=True, schedule="cooperative", scheduler="streamk", tile_m=128, stages=0, raster="m",
               swizzle=1, cluster=(2, 1))
CASES = [
    ((16, 4096, 4096), dict(SWAPPED, epilogue="tma", tile_n=16, tile_k=64, decomposition="dataparallel", splits=1)),
    ((16, 4096, 11008), dict(SWAPPED, epilogue="nosmem", tile_n=32, tile_k=128, decomposition="splitk", splits=2)),
    ((16, 12288, 4096), dict(SWAPPED, epilogue="nosmem", tile_n=64, tile_k=128, decomposition="heuristic",
                             splits=1)),
    ((16, 22016, 4096), dict(SWAPPED, epilogue="tma", tile_n=16, tile_k=128, decomposition="dataparallel",
                             splits=1)),
    ((64, 4096, 4096), dict(SWAPPED, epilogue="nosmem", tile_n=32, tile_k=64, decomposition="dataparallel",
                            splits=1)),
    ((64, 22016, 4096), dict(SWAPPED, epilogue="tma", tile_n=64, tile_k=64, decomposition="dataparallel",
                             splits=1)),
    ((4096, 4096, 4096), None),
]


def main() -> int:
    dirty, clean = om.Oracle(), CleanFlush()
    clean._flush.zero_()
    print("copy GB/s dirty", round(dirty.copy_bandwidth_gbps()), "clean", round(clean.copy_bandwidth_gbps()))
    for shape, point in CASES:
        problem = Problem.gemm(*shape, "bf16")
        a, b, c = make_inputs(problem, seed=0)
        fns = {"cublas": lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)}
        if point:
            kernel = cutlass.build(point, problem)
            fns["cutlass"] = lambda k=kernel, a=a, b=b, c=c: k(a, b, c)
        row: dict[str, list[float]] = {}
        for _ in range(2):
            for name, fn in fns.items():
                for tag, oracle in (("dirty", dirty), ("clean", clean)):
                    row.setdefault(f"{name}_{tag}", []).append(round(oracle.time(fn).median_ms * 1e3, 2))
        print(shape, json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
