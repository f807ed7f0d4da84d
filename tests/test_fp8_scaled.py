"""Scaled fp8 GEMM problems: their fields and keys, the inputs the workload makes (amax-quantized), the reference
and its tolerance, the baselines (torch._scaled_mm runs on the CPU too), and kernels that apply a scale along
the wrong axis, rejected by verification. All on the CPU (torch's CPU tensors, numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from evotune.core import hardware
from evotune.core.problem import FieldError, Problem, get_workload
from evotune.measurement.workloads import gemm, gemm_fp8

GEMM = get_workload("gemm")
SCALINGS = ("tensor", "row", "block")


def scaled(m: int, n: int, k: int, scaling: str) -> Problem:
    return Problem.gemm(m, n, k, "fp8", "tn", scaling)


# -- the problem
def test_a_scaled_problem_keys_counts_and_json():
    p = scaled(16, 4096, 7168, "block")
    assert p.key == "gemm_fp8_tn_16x4096x7168_blockscaled"
    assert p.describe() == "16x4096x7168 fp8 block-scaled tn"
    assert Problem.from_dict(p.to_dict()) == p and p.to_dict()["extra"] == {"scaling": "block"}
    assert p.bucket() == scaled(16, 4096, 8192, "block")
    # the scales are inputs too: fp32, (M, K/128) and (N/128, K/128)
    assert p.min_bytes == (16 * 7168 + 4096 * 7168) + 16 * 4096 * 2 + 4 * (16 * 56 + 32 * 56)
    assert scaled(16, 4096, 7168, "row").min_bytes == (16 * 7168 + 4096 * 7168) + 16 * 4096 * 2 + 4 * (16 + 4096)
    # an unscaled fp8 problem keeps its key, and tuned kernels of one scaling do not serve another
    assert Problem.gemm(16, 4096, 7168, "fp8").key == "gemm_fp8_tn_16x4096x7168"
    families = {GEMM.family(q) for q in (p, scaled(16, 4096, 7168, "row"), Problem.gemm(16, 4096, 7168, "fp8"))}
    assert len(families) == 3


@pytest.mark.parametrize(("table", "field", "says"), [
    ({"dtype": "bf16", "scaling": "row"}, "scaling", "only fp8 inputs are scaled, not bf16"),
    ({"dtype": "fp8", "scaling": "channel"}, "scaling", "unknown scaling 'channel'"),
    ({"dtype": "fp8", "scaling": "block", "k": 1000}, "k", "must be a multiple of 128"),
    ({"dtype": "fp8", "scaling": "block", "n": 4000}, "n", "must be a multiple of 128"),
    ({"dtype": "fp8", "scaling": "row", "layout": "nt"}, "layout", "takes layout tn"),
])
def test_a_bad_scaled_problem_names_its_field(table, field, says):
    with pytest.raises(FieldError) as exc:
        GEMM.parse({"m": 16, "n": 4096, "k": 4096, **table})
    assert exc.value.field == field and says in exc.value.message


# the three bad fp8 inputs, as an experiment file gives them: every command that reads one refuses it in one line
# naming the file and the field, exit code 2, and creates nothing (`run` is among tests/test_experiment_errors.py's)
BAD_FP8 = {
    "block-scaling-k-not-128": ('hardware = "H100"', 'dtype = "fp8", scaling = "block", k = 4000', "problem[0].k",
                                "must be a multiple of 128"),
    "block-scaling-n-not-128": ('hardware = "H100"', 'dtype = "fp8", scaling = "block", n = 4000', "problem[0].n",
                                "must be a multiple of 128"),
    "scaling-on-bf16": ('hardware = "H100"', 'dtype = "bf16", scaling = "tensor"', "problem[0].scaling",
                        "only fp8 inputs are scaled, not bf16"),
    "fp8-on-an-a100": ('hardware = "A100"', 'dtype = "fp8", scaling = "row"', "problem[0].dtype",
                       "fp8 needs FP8 tensor cores (sm_89 and newer); A100 (sm_80) has none"),
}


def _bad_fp8_experiment(folder, hardware_line: str, problem: str):
    table = ", ".join(f"{f} = {v}" for f, v in {"m": 16, "n": 4096, "k": 7168}.items() if f"{f} =" not in problem)
    path = folder / "fp8.toml"
    path.write_text(f"""name = "fp8"
space = "triton_decode_gemm"
{hardware_line}
problem = [{{ {table}, {problem} }}]
[oracle]
kind = "gpu"
[strategy]
name = "default"
[budget]
trials = 4
""")
    return path


# every case through `record`, and each through one more of the commands that read an experiment
COMMANDS = [(case, ["record"]) for case in sorted(BAD_FP8)] + [
    ("fp8-on-an-a100", ["record", "--compile-only"]), ("scaling-on-bf16", ["worker"]),
    ("block-scaling-n-not-128", ["best"])]


@pytest.mark.parametrize(("case", "command"), COMMANDS, ids=[f"{c}-{'-'.join(cmd)}" for c, cmd in COMMANDS])
def test_a_bad_fp8_experiment_is_one_line_exit_2_and_nothing_created(tmp_path, monkeypatch, capsys, command, case):
    from evotune.cli import main

    hardware_line, problem, field, says = BAD_FP8[case]
    path = _bad_fp8_experiment(tmp_path, hardware_line, problem)
    monkeypatch.chdir(tmp_path)  # default outputs (runs/) would land here
    before = sorted(tmp_path.rglob("*"))
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"evotune: error: {path}: {field}: ") and says in err, err
    assert len(err.strip().splitlines()) == 1
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(("args", "says"), [
    (["--problem", "16x4096x4000", "--scaling", "block"], "k: must be a multiple of 128"),
    (["--problem", "16x4000x7168", "--scaling", "block"], "n: must be a multiple of 128"),
    (["--dtype", "bf16", "--scaling", "row"], "scaling: only fp8 inputs are scaled, not bf16"),
    (["--hardware", "A100", "--scaling", "tensor"], "--hardware/--dtype: fp8 needs FP8 tensor cores (sm_89 and "
                                                    "newer); A100 (sm_80) has none"),
])
def test_spaces_refuses_the_same_fp8_problems_in_one_line(capsys, args, says):
    from evotune.cli import main

    assert main(["spaces", "--dtype", "fp8", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and err.startswith("evotune: error: ")


def test_parse_reads_the_scaling():
    assert GEMM.parse({"m": 16, "n": 256, "k": 384, "dtype": "fp8", "scaling": "block"}) == scaled(16, 256, 384,
                                                                                                   "block")
    assert GEMM.parse({"m": 16, "n": 256, "k": 384, "dtype": "fp8"}).scaling == ""


def test_a_gpu_the_table_lacks_has_fp8_from_sm_89(monkeypatch):
    def props(major: int, minor: int):
        return lambda device: {"name": "NVIDIA L40S", "major": major, "minor": minor, "sm_count": 142,
                               "smem_per_block": 99 * 1024, "smem_per_sm": 100 * 1024, "regs_per_sm": 65536,
                               "l2_bytes": 96 * 1024 * 1024}

    monkeypatch.setattr(hardware, "_query_cuda_python", props(8, 9))
    assert hardware.detect().has("fp8")
    monkeypatch.setattr(hardware, "_query_cuda_python", props(8, 6))
    assert not hardware.detect().has("fp8")
    assert hardware.get_hardware("H100").has("fp8") and not hardware.get_hardware("A100").has("fp8")


# -- the inputs, the reference, the baselines (torch on the CPU)
torch = pytest.importorskip("torch")


def inputs(problem: Problem, seed: int = 1):
    return gemm.make_inputs(problem, seed=seed, device="cpu")


@pytest.mark.parametrize("scaling", SCALINGS)
def test_the_inputs_are_amax_quantized_with_scales_shaped_as_documented(scaling):
    p = scaled(64, 256, 384, scaling)
    a, b, scale_a, scale_b, c = inputs(p)
    assert a.dtype == b.dtype == torch.float8_e4m3fn and c.dtype == torch.bfloat16
    assert a.shape == (64, 384) and a.stride() == (384, 1)
    assert b.shape == (384, 256) and b.stride() == (1, 384)  # the (K, N) view of (N, K) row-major weights
    assert c.isnan().all()  # poisoned
    shapes = {"tensor": ((), ()), "row": ((64, 1), (1, 256)), "block": ((64, 3), (2, 3))}[scaling]
    assert (tuple(scale_a.shape), tuple(scale_b.shape)) == shapes
    assert scale_a.dtype == scale_b.dtype == torch.float32 and scale_a.is_contiguous() and scale_b.is_contiguous()
    # every group's largest magnitude is e4m3's largest finite value: the scale is the group's amax / 448
    ga, gb = gemm_fp8.scale_groups(p)
    for q, group, rows in ((a, ga, 64), (b.t(), gb, 256)):
        grouped = q.float().abs().reshape(rows // group[0], group[0], 384 // group[1], group[1])
        assert (grouped.amax(dim=(1, 3)) == 448).all()
    if scaling != "tensor":  # scales that differ along their axes: a scale on a wrong axis shows
        assert scale_a.std() > 0.2 * scale_a.mean() and scale_b.std() > 0.1 * scale_b.mean()
    # a second seed gives other numbers; the same seed the same
    assert torch.equal(inputs(p)[0].float(), a.float()) and not torch.equal(inputs(p, 2)[0].float(), a.float())
    # fill=False only allocates, in the same shapes
    empty = gemm.make_inputs(p, fill=False, device="cpu")
    assert [tuple(t.shape) for t in empty] == [tuple(t.shape) for t in (a, b, scale_a, scale_b, c)]


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_torch_scaled_mm_is_the_baseline_and_meets_the_reference(scaling):
    p = scaled(32, 256, 512, scaling)
    (name, fn), = GEMM.baselines(p).items()
    assert name.startswith("torch._scaled_mm (per-")
    ins = inputs(p)
    fn(*ins)
    ok, err, why = GEMM.verify(p, ins)
    assert ok and err < 5e-3, why


def test_block_scaling_takes_torch_functional_scaled_mm_with_cublas_scale_layouts():
    p = scaled(64, 256, 384, "block")
    baselines = GEMM.baselines(p)
    if not hasattr(torch.nn.functional, "scaled_mm"):
        assert baselines == {}
        return
    (name, fn), = baselines.items()
    assert name == "torch.nn.functional.scaled_mm (1x128 and 128x128 block scales)"
    ins = inputs(p)
    args = fn.prepare(ins)
    assert args[:2] == ins[:2] and args[-1] is ins[-1]  # the output is the one verified
    scale_a, scale_b = args[2:4]
    assert scale_a.shape == (64, 3) and scale_a.stride() == (1, 64)  # column-major
    assert scale_b.shape == (4, 2) and scale_b.stride() == (1, 4)  # K/128 rounded up to 4, N/128


def emulated(p: Problem, a, b, scale_a, scale_b, c, wrong_axis: bool = False):
    """A kernel in torch, as the block-fp8 and decode kernels compute: a dot per 128-group of K, scaled, summed in
    fp32; ``wrong_axis`` applies each operand's scale along the other operand's axis (per-tensor scales have no
    axis: it leaves scale_b out)."""
    af, bf = a.float(), b.float()
    if p.scaling == "tensor":
        out = (af @ bf) * scale_a * (1.0 if wrong_axis else scale_b)
    elif p.scaling == "row":
        out = (af @ bf) * (scale_b.reshape(-1, 1) * scale_a.reshape(1, -1) if wrong_axis else scale_a * scale_b)
    else:
        sb = scale_b.t() if wrong_axis else scale_b  # (K/128, N/128) read as (N/128, K/128)
        out = torch.zeros(c.shape)
        for g in range(p.k // 128):
            part = af[:, g * 128:(g + 1) * 128] @ bf[g * 128:(g + 1) * 128]
            out += part * scale_a[:, g:g + 1] * sb[:, g].repeat_interleave(128)[None, :]
    c.copy_(out)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_a_scale_on_the_wrong_axis_is_rejected_by_verification(scaling):
    p = scaled(256, 256, 256, scaling)  # square: the wrong axis has the right length
    ins = inputs(p, seed=3)
    emulated(p, *ins)
    ok, err, why = GEMM.verify(p, ins)
    assert ok and err < 5e-3, why
    gemm.poison(ins[-1])
    emulated(p, *ins, wrong_axis=True)
    ok, err, why = GEMM.verify(p, ins)
    assert not ok and err > 10 * gemm_fp8.SCALED_TOLERANCE and "relative error" in why and "fp8 with" in why, why
    gemm.poison(ins[-1])
    ok, _, why = GEMM.verify(p, ins)
    assert not ok and "NaN" in why  # an unwritten output


# -- the CPU oracle (numpy)
def test_numpy_e4m3_rounding_is_torch_s():
    values = np.concatenate([np.linspace(-448, 448, 20001), np.geomspace(1e-4, 448, 5001),
                             -np.geomspace(1e-4, 448, 5001), [0.0, 2 ** -9, 3 * 2 ** -10, 448.0]])
    expected = torch.tensor(values).to(torch.float8_e4m3fn).double().numpy()
    assert np.array_equal(gemm_fp8.round_e4m3(values), expected)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_cpu_inputs_and_check_follow_the_scaling(scaling):
    p = scaled(128, 256, 256, scaling)
    a, b, scale_a, scale_b = GEMM.cpu_inputs(p, seed=5)
    assert np.array_equal(gemm_fp8.round_e4m3(a), a) and np.array_equal(gemm_fp8.round_e4m3(b), b)
    assert (scale_a.shape, scale_b.shape) == gemm_fp8.scale_shapes(p)
    ga, gb = gemm_fp8.scale_groups(p)
    right = (a * gemm_fp8.expand_np(scale_a, ga, 128, 256)) @ (b * gemm_fp8.expand_np(scale_b, gb, 256, 256).T)
    assert GEMM.cpu_verify(p, (a, b, scale_a, scale_b), right)[0]
    if scaling == "block":  # the weights' block scales read transposed
        wrong = (a * gemm_fp8.expand_np(scale_a, ga, 128, 256)) @ (
            b * gemm_fp8.expand_np(scale_b.T, gb, 256, 256).T)
    else:  # the scales of B left out
        wrong = (a * gemm_fp8.expand_np(scale_a, ga, 128, 256)) @ b
    ok, _, why = GEMM.cpu_verify(p, (a, b, scale_a, scale_b), wrong)
    assert not ok and "relative error" in why
