"""A GPU search space whose points misbehave on purpose: for the isolation tests.

``mode`` picks the behaviour: ``ok`` (a correct Triton GEMM), ``wrong`` (the same
GEMM plus one), ``crash`` (writes far outside its buffer: an illegal address),
``hang`` (spins forever) and ``compile`` (raises while building).
"""

from __future__ import annotations

from evotune.authoring import Point, Problem, SearchSpace, categorical


def build(point: Point, problem: Problem):
    import torch
    import triton
    import triton.language as tl

    from search_spaces.triton_matmul import SPACE as MATMUL

    mode = point["mode"]
    if mode == "compile":
        raise RuntimeError("this configuration does not compile (on purpose)")
    good = MATMUL.build({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1,
                         "num_warps": 8, "num_stages": 3, "num_ctas": 1}, problem)
    if mode == "ok":
        return good
    if mode == "wrong":
        def wrong(a, b, c):
            good(a, b, c)
            c.add_(1)
        return wrong

    @triton.jit
    def bad(ptr, HANG: tl.constexpr):
        if HANG:
            while tl.load(ptr, volatile=True) > 0:  # the buffer holds 1.0 and nothing changes it
                pass
        else:
            far = (tl.program_id(0).to(tl.int64) + 1) << 40  # a terabyte past the buffer, per program
            tl.store(ptr + far, 1.0)

    def faulty(a, b, c):
        scratch = torch.ones(1, device="cuda")
        bad[(64,)](scratch, HANG=mode == "hang")
    return faulty


SPACE = SearchSpace("gpu_faults", [categorical("mode", ["ok", "wrong", "crash", "hang", "compile"])], build=build)
