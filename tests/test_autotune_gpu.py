"""evotune.autotune on a GPU (``pytest -m gpu``): a configuration whose compiled kernel asks for more shared
memory than the GPU has is pruned with that reason before it is timed; the others are timed by the oracle and
the chosen one computes ``a @ b``. In a process of its own, so that triton is imported without the
interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys, torch, triton
sys.path.insert(0, {folder!r})
import matmul as mm
import evotune

huge = triton.Config({{"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8}}, num_warps=8, num_stages=5)
configs = [*mm.CONFIGS[-3:], huge]
kernel = evotune.autotune(configs=configs, key=["M", "N", "K"], cache={cache!r})(mm.matmul_kernel.fn)
a = torch.randn(512, 512, device="cuda", dtype=torch.float16)
b = torch.randn(512, 512, device="cuda", dtype=torch.float16)
c = mm.matmul(a, b, kernel=kernel)
torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)
fields = kernel.key_fields(dict(zip(kernel.arg_names, mm.launch_args(a, b, c))), {{}})
trials = kernel.decision_store.existing(fields, kernel.candidates.space).history()
print(json.dumps({{"trials": [[(t.point["BLOCK_M"], t.point["BLOCK_N"]), t.status.value, t.attrs.get("message", "")]
                             for t in trials],
                  "chosen": kernel.best_config.kwargs, "timer": kernel.timer.kind, "how": kernel.last_decision.how}}))
"""


def test_shared_memory_over_the_gpu_is_pruned_before_timing(tmp_path: Path) -> None:
    script = SCRIPT.format(folder=str(ROOT / "examples" / "triton_autotune"), cache=str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["timer"] == "oracle" and got["how"] == "confirmed"
    assert len(got["trials"]) == 4
    (huge,) = [t for t in got["trials"] if t[0] == [256, 256]]  # the 256 x 256 tile with 5 stages
    assert huge[1] in ("infeasible", "compile_error") and "shared memory" in huge[2]
    assert all(t[1] == "ok" for t in got["trials"] if t[0] != [256, 256])
    assert (got["chosen"]["BLOCK_M"], got["chosen"]["BLOCK_N"]) != (256, 256)


REFUSED = """
import json, torch, triton
import triton.language as tl
import evotune


@triton.jit
def copy_staged(src, dst, n, STAGES: tl.constexpr, BLOCK: tl.constexpr):
    # a pipelined copy: STAGES buffers of BLOCK floats in shared memory
    offs = tl.arange(0, BLOCK)
    for i in tl.range(0, tl.cdiv(n, BLOCK), num_stages=STAGES):
        o = i * BLOCK + offs
        tl.store(dst + o, tl.load(src + o, mask=o < n), mask=o < n)


@triton.jit
def add_one(src, dst, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + o, tl.load(src + o, mask=o < n) + 1, mask=o < n)


def run(kernel, configs, grid, args, kwargs):
    seen = {{"open": 0, "pre": 0, "post": 0, "unpaired": 0, "exceptions": []}}

    def pre_hook(nargs, reset_only=False):
        if not reset_only:
            seen["open"] += 1
            seen["pre"] += 1

    def post_hook(nargs, exception):
        seen["open"] -= 1
        seen["post"] += 1
        seen["unpaired"] += seen["open"] != 0
        if exception is not None:
            seen["exceptions"].append(f"{{type(exception).__name__}}: {{exception}}")

    tuned = evotune.autotune(configs, ["n"], pre_hook=pre_hook, post_hook=post_hook, cache={cache!r})(kernel)
    tuned[grid](*args, **kwargs)
    torch.cuda.synchronize()
    return {{"exceptions": seen["exceptions"], "paired": seen["unpaired"] == 0 and seen["pre"] == seen["post"],
             "chosen": tuned.best_config.all_kwargs()}}


n = 1 << 16
src = torch.randn(n, device="cuda")
out = {{}}
dst = torch.empty_like(src)
out["shared memory"] = run(copy_staged, [triton.Config({{"STAGES": 64, "BLOCK": 4096}}),
                                         triton.Config({{"STAGES": 2, "BLOCK": 1024}})], (1,), (src, dst, n), {{}})
out["shared memory"]["correct"] = bool(torch.equal(dst, src))
dst = torch.empty_like(src)
out["threads"] = run(add_one, [triton.Config({{}}, num_warps=128), triton.Config({{}}, num_warps=4)],
                     lambda m: (triton.cdiv(n, m["BLOCK"]),), (src, dst, n), {{"BLOCK": 1024}})
out["threads"]["correct"] = bool(torch.equal(dst, src + 1))
print(json.dumps(out))
"""


def test_a_refused_configuration_reaches_the_post_hook_and_another_runs(tmp_path: Path) -> None:
    """On a GPU: a configuration over the shared memory (64 stages of 16 KiB) and one over the threads per block
    (128 warps) are refused when their binary is loaded; the post_hook gets that OutOfResources, the hooks stay
    paired, and the launch runs with the other configuration."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    script = tmp_path / "refused.py"  # a file: Triton reads a jit kernel's source from the file it is defined in
    script.write_text(REFUSED.format(cache=str(tmp_path / "cache")))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for resource, result in got.items():
        (message,) = result["exceptions"]
        assert message.startswith(f"OutOfResources: out of resource: {resource}, Required: "), (resource, message)
        assert result["paired"] and result["correct"], (resource, result)
    assert got["shared memory"]["chosen"]["STAGES"] == 2 and got["threads"]["chosen"]["num_warps"] == 4
