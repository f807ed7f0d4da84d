"""The compiler against the spaces' pruning: the shipped compile-only files, the binary reader, the command.

The shipped files are read on the CPU with no CuTe DSL; the one test that
compiles is skipped where CuTe DSL (and torch) are missing.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from evotune.core.compile_results import Compiled, CompiledError, agreement, find_compiled, load_compiled
from evotune.core.hardware import get_hardware
from evotune.core.problem import Problem
from evotune.core.space import Context
from evotune.measurement.binary import BinaryError, launch_smem_from_ir, read_cubin, read_object
from search_spaces import cute_blackwell_gemm, cute_hopper_gemm

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ROOT / "evotune" / "landscapes" / "compile"
CHECKS = [(cute_blackwell_gemm.SPACE, "B200", dtype) for dtype in ("bf16", "int8")] + [
    (cute_hopper_gemm.SPACE, "H100", dtype) for dtype in ("bf16", "int8")]


@pytest.mark.parametrize(("space", "hw", "dtype"), CHECKS, ids=lambda v: getattr(v, "name", v))
def test_shipped_compile_files_agree_with_the_pruning(space, hw, dtype):
    """Every feasible point was compiled for the target and builds: no false-feasible point."""
    path = find_compiled(COMPILED, space.name, hw, dtype, "tn")
    assert path is not None, f"no compile-only file for {space.name} on {hw} ({dtype})"
    table = load_compiled(path, space)
    hardware = get_hardware(hw)
    assert table.meta["arch"] == hardware.arch and table.meta["dtype"] == dtype
    ctx = Context(hardware, Problem.gemm(4096, 4096, 4096, dtype))
    a = agreement(space, ctx, table)
    assert a.checked_feasible == a.feasible_total > 0
    assert a.false_feasible == []
    # pruned points were compiled too; none that the compiler can judge builds
    assert a.checked_pruned > 0 and sum(a.agreed_pruned.values()) > 0
    assert sum(a.false_infeasible.values()) == 0, a.examples
    assert sum(a.agreed_pruned.values()) + sum(a.unjudged.values()) == a.checked_pruned
    assert all(c.error for c in table.rows.values() if not c.ok)
    assert all(c.regs and c.smem and c.stages >= 2 for c in table.rows.values() if c.ok)


def test_a_point_that_compiles_but_overflows_shared_memory_does_not_build():
    h100 = get_hardware("H100")
    assert Compiled(True, 1.0, regs=90, frame_bytes=0, smem=h100.smem_per_block).builds(h100)
    too_big = Compiled(True, 1.0, regs=90, frame_bytes=0, smem=h100.smem_per_block + 1)
    assert "shared memory" in too_big.why_not(h100)
    assert Compiled(False, 0.1, error="expects the M-mode to be 128 or 256").why_not(h100).startswith("expects")


def test_a_file_for_another_space_is_refused(tmp_path):
    path = find_compiled(COMPILED, "cute_hopper_gemm", "H100", "bf16", "tn")
    with pytest.raises(CompiledError, match="parameters"):
        load_compiled(path, cute_blackwell_gemm.SPACE)
    bad = tmp_path / "x.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(CompiledError, match=r"x\.json\.gz"):
        load_compiled(bad)


# -- reading binaries ------------------------------------------------------------------
def _cubin(regs: int, frame: int, shared: int) -> bytes:
    """A minimal cubin: a section-name table, ``.nv.info`` with a register count and a frame size, ``.nv.shared.k``."""
    names = b"\0.shstrtab\0.nv.info\0.nv.shared.k\0"
    info = struct.pack("<BBHII", 4, 0x2F, 8, 7, regs) + struct.pack("<BBHII", 4, 0x11, 8, 7, frame)
    info += struct.pack("<BBH", 3, 0x1B, 255)  # a 16-bit attribute the reader skips
    body = names + info
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0,
                                                                   64, 0, 0, 64, 4, 1)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 11, 0x70000000, 0, 0, 64 + len(names), len(info), 0, 0, 4, 0),
                struct.pack("<IIQQQQIIQQ", 20, 8, 0, 0, shoff, shared, 0, 0, 16, 0)]
    return header + body + b"".join(sections)


def test_registers_frame_and_shared_memory_are_read_from_a_cubin_and_its_fatbin():
    cubin = _cubin(regs=168, frame=16, shared=1024)
    res = read_cubin(cubin)
    assert (res.regs, res.frame_bytes, res.static_smem) == (168, 16, 1024)
    entry = struct.pack("<HHIQ", 2, 0x101, 32, len(cubin)) + bytes(12) + struct.pack("<I", 100)
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entry) + len(cubin)) + entry + cubin
    host_object = b"\x7fELF host code ..." + fatbin + b"... more host code"
    res = read_object(host_object)
    assert (res.regs, res.frame_bytes, res.static_smem, res.sm) == (168, 16, 1024, 100)
    with pytest.raises(BinaryError):
        read_object(b"\x7fELF" + bytes(60))


def test_the_launch_shared_memory_is_read_from_the_host_ir():
    config = "!llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"
    ir = f"""
  llvm.func @other() {{
    %21 = llvm.mlir.constant(7 : i64) : i64
  }}
  llvm.func @launch() {{
    %21 = llvm.mlir.constant(229632 : i64) : i64
    %291 = llvm.getelementptr %285[0, 2] : (!llvm.ptr) -> !llvm.ptr, {config}
    llvm.store %21, %291 : i64, !llvm.ptr
  }}"""
    assert launch_smem_from_ir(ir) == 229632
    assert launch_smem_from_ir("llvm.func @f() {}") is None


# -- the command -------------------------------------------------------------------------
def _evotune(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evotune", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_compile_only_refuses_a_space_that_cannot_compile_alone_and_bad_counts(tmp_path):
    exp = tmp_path / "t.toml"
    exp.write_text('space = "triton_matmul"\nhardware = "H100"\n[oracle]\nkind = "gpu"\n'
                   '[[problem]]\nm = 64\nn = 64\nk = 64\n[strategy]\nname = "random"\n[budget]\ntrials = 5\n')
    out = _evotune("record", "--compile-only", str(exp), "--out", str(tmp_path))
    assert out.returncode == 2 and "t.toml" in out.stderr and "space" in out.stderr
    out = _evotune("record", "--compile-only", "experiments/b200_compile.toml", "--pruned", "x")
    assert out.returncode == 2 and "--pruned" in out.stderr


def test_spaces_says_how_many_feasible_points_the_compiler_checked_and_when():
    from evotune.cli.results import _compiler_check

    ctx = Context(get_hardware("B200"), Problem.gemm(4096, 4096, 4096, "bf16"))
    line = _compiler_check(cute_blackwell_gemm.SPACE, ctx, str(COMPILED))
    table = load_compiled(find_compiled(COMPILED, "cute_blackwell_gemm", "B200", "bf16", "tn"))
    feasible = len(cute_blackwell_gemm.SPACE.feasible(ctx))
    assert line.startswith(f"{feasible} of {feasible} feasible compiled for sm_100a on {table.meta['date']}")
    assert "0 false-feasible" in line
    assert _compiler_check(cute_hopper_gemm.SPACE, ctx, str(COMPILED)) == "-"  # no file for it on a B200
    out = _evotune("spaces", "--hardware", "B200", "-v")
    assert out.returncode == 0 and "sm_100a" in out.stdout and "compiler" in out.stdout, out.stderr
    assert "TMEM" in out.stdout  # each space's description, with -v


@pytest.mark.parametrize(("space", "hw", "point"), [
    (cute_blackwell_gemm.SPACE, "B200",
     {"mma_m": 256, "mma_n": 128, "cluster": (2, 1), "use_2cta_instrs": True, "use_tma_store": True}),
    (cute_hopper_gemm.SPACE, "H100",
     {"tile_m": 128, "tile_n": 128, "cluster": (2, 1), "swizzle": 2, "raster": "n", "stages": 4}),
], ids=["sm100", "sm90"])
def test_a_point_compiles_for_its_target_without_a_gpu(space, hw, point):
    pytest.importorskip("torch")
    pytest.importorskip("cutlass.operators")
    hardware = get_hardware(hw)
    res = space.compile_only(point, Problem.gemm(4096, 4096, 4096, "bf16"), hardware)
    assert res["sm"] == hardware.sm_version and res["regs"] > 0
    assert 0 < res["smem"] <= hardware.smem_per_block and res["stages"] >= 2


def test_a_precompiled_sm90_kernel_is_cached_as_a_library_that_loads_without_cute_dsl(monkeypatch, tmp_path):
    """What a compile process leaves in the cache, a GPU worker loads through tvm-ffi without importing CuTe DSL."""
    import shutil

    pytest.importorskip("torch")
    pytest.importorskip("cutlass.operators")
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to link the kernel's library")
    from search_spaces import _cute_aot, _cute_sm90

    _cute_aot.set_target(get_hardware("H100"))
    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path))
    # no GPU here: the device facts a compile process would ask the driver for
    monkeypatch.setattr(_cute_sm90, "_toolchain", lambda: ("4.8.1", "NVIDIA H100 80GB HBM3", 132))
    monkeypatch.setattr(_cute_sm90, "_max_active_clusters", lambda size: 132 // size)
    point = {"tile_m": 128, "tile_n": 128, "cluster": (2, 1), "swizzle": 2, "raster": "n", "stages": 4}
    problem = Problem.gemm(4096, 4096, 4096, "bf16")
    assert _cute_sm90.precompile(point, problem) is False
    assert _cute_sm90.precompile(dict(point), Problem.gemm(16, 8192, 1024, "bf16")) is True  # shapes are symbolic
    key = _cute_sm90._cache_key(point, problem)
    assert (tmp_path / "cute" / f"{key}.o").is_file() and (tmp_path / "cute" / f"{key}.so").is_file()
    code = ("import sys; from search_spaces import _cute_sm90 as s; f = s._load(sys.argv[1]); "
            "print(type(f).__name__, 'cutlass' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, key], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.split() == ["Function", "False"]


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_the_sm100_shared_memory_model_reproduces_every_binary(dtype):
    """The space's model of the kernel's stage heuristic gives each binary's launch shared memory and stages."""
    space = cute_blackwell_gemm.SPACE
    table = load_compiled(find_compiled(COMPILED, space.name, "B200", dtype, "tn"), space)
    problem, cap = Problem.gemm(4096, 4096, 4096, dtype), get_hardware("B200").smem_per_block
    built = [(p, table.get(space, p)) for p in space.points() if table.get(space, p) and table.get(space, p).ok]
    assert len(built) > 500
    for point, c in built:
        smem, stages, _ = cute_blackwell_gemm.launch_smem(point, problem, cap)
        assert (smem, stages) == (c.smem, c.stages), point


def test_an_experiment_hands_the_compiled_resources_to_the_estimate(tmp_path):
    from evotune.core.compile_results import CompiledTable
    from evotune.running.experiment import ExperimentError, load_experiment
    from evotune.running.targets import targets

    exp = tmp_path / "e.toml"
    body = ('space = "cute_blackwell_gemm"\nhardware = "B200"\n[oracle]\nkind = "gpu"\n'
            '[[problem]]\nm = 4096\nn = 4096\nk = 4096\n[strategy]\nname = "random"\n[budget]\ntrials = 5\n')
    exp.write_text(f'compiled = "{COMPILED}"\n' + body)
    (target,) = targets(load_experiment(exp))
    assert target.ctx.compiled is not None and target.ctx.compiled.meta["arch"] == "sm_100a"
    exp.write_text('compiled = "nowhere"\n' + body)
    with pytest.raises(ExperimentError, match="compiled"):
        load_experiment(exp)
    # a binary with fewer stages than the model expects ranks as slower (less latency hidden)
    space, point = cute_blackwell_gemm.SPACE, {"mma_m": 128, "mma_n": 64, "cluster": (1, 1),
                                               "use_2cta_instrs": False, "use_tma_store": True}
    ctx = Context(get_hardware("B200"), Problem.gemm(16, 4096, 4096, "bf16"))
    table = CompiledTable({}, {space.key(point): Compiled(True, 1.0, regs=100, frame_bytes=0, smem=50_000,
                                                          stages=2)})
    assert space.estimate(point, Context(ctx.hardware, ctx.problem, compiled=table)) > space.estimate(point, ctx)


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_the_sm90_shared_memory_model_is_each_binarys(dtype):
    """What the space counts against the limit is what each sm90 binary launches with, pruned points included."""
    space = cute_hopper_gemm.SPACE
    table = load_compiled(find_compiled(COMPILED, space.name, "H100", dtype, "tn"), space)
    problem = Problem.gemm(4096, 4096, 4096, dtype)
    assert len(table.rows) == space.size
    for point in space.points():
        assert table.get(space, point).smem == cute_hopper_gemm.smem_bytes(point, problem), point


def test_a_cached_cute_binary_is_keyed_by_the_code_it_was_built_from(monkeypatch):
    """An upgrade of NVIDIA's operators package, or a change to the adapter, must not find the binaries built
    before it: they hold the old kernel."""
    from search_spaces import _cute_sm90

    monkeypatch.setattr(_cute_sm90, "_toolchain", lambda: ("4.8.1", "NVIDIA H100 80GB HBM3", 132))
    point = {"tile_m": 128, "tile_n": 128, "cluster": (2, 1), "swizzle": 2, "raster": "n", "stages": 4}
    problem = Problem.gemm(4096, 4096, 4096, "bf16")
    keys = set()
    for built_from in [("0.3.0", "a" * 16), ("0.4.0", "a" * 16), ("0.3.0", "b" * 16)]:
        monkeypatch.setattr(_cute_sm90, "_kernel_source", lambda b=built_from: b)
        keys.add(_cute_sm90._cache_key(point, problem))
    assert len(keys) == 3
    monkeypatch.undo()
    operators, source = _cute_sm90._kernel_source()
    assert len(source) == 16 and operators  # this checkout's adapter, whether or not the package is installed
