"""FP8 models in ``tune-model``: the fused-MoE kernel with e4m3 activations and weights (per-tensor scales, vLLM's
``fp8_w8a8``) checked against the product of the values its inputs stand for (Triton's interpreter), and an fp8
model's plan and files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from search_spaces import _triton_fused_moe as moe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
M, N, K, E, TOP_K = 8, 32, 64, 4, 2
SMALL = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16, "num_warps": 4,
         "num_stages": 3}
#: the fp8 launch and its check, in a process of its own: Triton's interpreter runs only where TRITON_INTERPRET
#: was set before triton was imported
CHECK = """
import json, sys, torch
from search_spaces import _triton_fused_moe as moe
M, N, K, E, TOP_K = {shape}
BLOCK = {block}
x, gate, w = moe.make_inputs(M, N, K, E, "float32", seed=3)
weights, ids = moe.route(x, gate, TOP_K)
xq, a_scale, wq, w_scale = moe.quantize_fp8_blocks(x, w, BLOCK) if BLOCK else moe.quantize_fp8(x, w)
grid, args, kwargs = moe.make_launch(xq, wq, weights, ids, TOP_K, (a_scale, w_scale), BLOCK)
assert kwargs["FP8"] and kwargs["SCALE_BLOCK"] == BLOCK and args[2].dtype == torch.bfloat16
xd, wd = moe.dequantized(xq, a_scale, wq, w_scale, BLOCK)
experts = ids.flatten()
ref = torch.stack([weights.flatten()[s] * (xd[s // TOP_K] @ wd[experts[s]].T) for s in range(M * TOP_K)])
errors = []
for config in json.loads(sys.argv[1]):
    args[2].zero_()
    moe.moe_gemm_kernel[grid](*args, **kwargs, **config)
    errors.append(((args[2].float() - ref).norm() / ref.norm()).item())
unscaled = dict(kwargs, FP8=False, SCALE_BLOCK=0)  # the same e4m3 product without its scales
args[2].zero_()
moe.moe_gemm_kernel[grid](*args, **unscaled, **json.loads(sys.argv[1])[0])
print(json.dumps({{"errors": errors, "unscaled": ((args[2].float() - ref).norm() / ref.norm()).item()}}))
"""


@pytest.mark.slow  # Triton's interpreter in a process of its own, torch imported there
@pytest.mark.parametrize("block", [0, 128])  # per tensor; DeepSeek-V3's 1 x 128 and 128 x 128 blocks
def test_the_fp8_kernel_matches_the_dequantized_fp32_product(block: int) -> None:
    configs = [moe.default_config(M, E), SMALL]
    shape = (M, N, K, E, TOP_K) if not block else (M, 256, 256, E, TOP_K)  # two scale blocks along N and K
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    got = subprocess.run([sys.executable, "-c", CHECK.format(shape=shape, block=block), json.dumps(configs)],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 0, got.stderr[-3000:]
    doc = json.loads(got.stdout.strip().splitlines()[-1])
    assert all(err < 1e-2 for err in doc["errors"]), doc  # bf16 output of the exact product of the e4m3 values
    assert doc["unscaled"] > 0.5  # the scales matter: without them the rows are far off


def test_quantization_maps_the_largest_magnitude_to_e4m3s_largest() -> None:
    x, _, w = moe.make_inputs(M, N, K, E, "float32", seed=3)
    xq, a_scale, wq, w_scale = moe.quantize_fp8(x, w)
    assert xq.dtype == wq.dtype == torch.float8_e4m3fn and w_scale.shape == (E,)
    assert xq.float().abs().max().item() == 448.0 and (wq.float().abs().amax(dim=(1, 2)) == 448.0).all()
    xd, wd = moe.dequantized(xq, a_scale, wq, w_scale)
    assert ((xd - x).norm() / x.norm()).item() < 0.05 and ((wd - w).norm() / w.norm()).item() < 0.05


def test_block_quantization_scales_each_group_by_its_own_largest_magnitude() -> None:
    x, _, w = moe.make_inputs(M, 256, 256, E, "float32", seed=3)
    xq, a_scale, wq, w_scale = moe.quantize_fp8_blocks(x, w, 128)
    assert a_scale.shape == (M, 2) and w_scale.shape == (E, 2, 2)
    groups = xq.float().reshape(M, 2, 128).abs().amax(dim=2)
    assert (groups == 448.0).all()  # every row's every group reaches e4m3's largest
    xd, wd = moe.dequantized(xq, a_scale, wq, w_scale, 128)
    assert ((xd - x).norm() / x.norm()).item() < 0.05 and ((wd - w).norm() / w.norm()).item() < 0.05
    with pytest.raises(ValueError, match="must be multiples of the scale block 128"):
        moe.quantize_fp8_blocks(x[:, :100], w[:, :, :100], 128)


def test_an_fp8_key_launches_e4m3_inputs_with_their_scales() -> None:
    _, args, kwargs = moe.make_args(M, N, K, E, TOP_K, "float8_e4m3fn")
    assert args[0].dtype == args[1].dtype == torch.float8_e4m3fn and kwargs["FP8"]
    assert args[7].shape == (1,) and args[8].shape == (E,)
    _, args16, kwargs16 = moe.make_args(M, N, K, E, TOP_K, "bfloat16")
    assert not kwargs16["FP8"] and args16[2].dtype == torch.bfloat16


def test_an_fp8_moe_files_name_vllms_fp8_dtype_and_the_checker_knows_it(tmp_path) -> None:
    from evotune.model import exports
    from evotune.model.models import load_model
    from evotune.model.outcome import Outcome
    from evotune.model.plan import make_plan
    from evotune.triton_tuning.export import ExportError, check_vllm_config

    plan = make_plan(load_model("Mixtral-8x7B"), 2, "fp8", (16, 64))
    config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 3}
    outcomes = [Outcome(k.ident, k.shape.name, k.shape.family.value, k.fields(), config, 8, 8, 1.0, 0.1, 0.2,
                        "confirmed", "NVIDIA H100 80GB HBM3", "3.4.0", "vllm_fused_moe")
                for k in plan.keys if k.shape.family.value == "fused_moe"]
    written = exports.write_server_files(outcomes, tmp_path, "fp8", None)  # scaled per tensor: no block shape
    names = sorted(p.name for p in written)
    assert names[0] == names[1] == "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json"
    with pytest.raises(ExportError, match="dtype: vLLM names a fused-MoE file's dtype one of fp8_w8a8"):
        check_vllm_config("E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8.json", {"16": config})
