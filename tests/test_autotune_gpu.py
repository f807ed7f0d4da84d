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
trials = kernel.kernel_cache.existing(fields, kernel.candidates.space).history()
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
