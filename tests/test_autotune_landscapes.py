"""The matmul example's large space and benchmarks/autotune_landscapes.py on the CPU (Triton interpreter, tiny
shapes): the feasible count, the sampled landscape files, failed configurations recorded and not timed.
Nothing here looks at a time's value."""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from evotune.core.hardware import get_hardware  # noqa: E402
from evotune.core.landscape import load_landscape  # noqa: E402
from evotune.core.result import EvalResult, Status  # noqa: E402
from evotune.core.space import FeasibleSet  # noqa: E402
from evotune.triton_tuning.configs import LaunchContext  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "autotune_landscapes.py"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    return load_benchmark("autotune_landscapes", monkeypatch, interpret=True)


def ctx(hardware: str | None, dtype: torch.dtype) -> LaunchContext:
    return LaunchContext(hardware=get_hardware(hardware) if hardware else None,
                         args={"a_ptr": torch.empty(1, dtype=dtype)})


def by_the_rules(smem: int, element: int) -> int:
    """The feasible count of the space's rules, counted over the whole product."""
    n = 0
    for bm, bn, bk, _g, w, s in itertools.product((16, 32, 64, 128, 256), (16, 32, 64, 128, 256), (16, 32, 64, 128),
                                                  (1, 4, 8), (2, 4, 8), (2, 3, 4, 5)):
        n += (bm + bn) * bk * element * s <= smem and 256 * w <= bm * bn <= 4096 * w
    return n


def test_the_matmul_space_holds_over_2000_feasible_fp16_configurations_on_an_h100(bench) -> None:
    space = bench.ms.SPACE
    assert space.size == 3600
    fs = FeasibleSet.build(space, ctx("H100", torch.float16))
    h100 = get_hardware("H100")
    assert len(fs) == by_the_rules(h100.smem_per_block, 2) >= 2000
    assert {fs.reasons[r].split(":")[0] for r in fs.pruned} == {"shared-memory", "accumulator-registers",
                                                                "warps-for-tile"}
    # the GPU's limit and the launch's element size are read: less shared memory or wider elements, fewer points
    assert len(FeasibleSet.build(space, ctx("A100", torch.float16))) == by_the_rules(
        get_hardware("A100").smem_per_block, 2) < len(fs)
    assert len(FeasibleSet.build(space, ctx("H100", torch.float32))) == by_the_rules(h100.smem_per_block, 4) < len(fs)
    # without a GPU in the context (as evotune.autotune builds it): the H100's limits
    assert len(FeasibleSet.build(space, ctx(None, torch.float16))) == len(fs)


def run_script(tmp_path: Path, *args: str, jobs: int = 1) -> subprocess.CompletedProcess:
    """The script on the CPU: each compile worker is a process that imports torch and Triton (seconds), so one
    unless the test is of several."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "32x32x32,16x48x32", "--jobs", str(jobs),
                           "--out", str(tmp_path), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """One recording of four sampled points on both shapes by two compile workers, with one confirmation round of
    one sample (the run's last step runs; its interpreted launches, 100 per point by default, are what the tests
    do not look at): (its folder, the run). The tests that read or confirm the files share it."""
    out = tmp_path_factory.mktemp("recorded")
    return out, run_script(out, "--sample", "4", "--seed", "3", "--checkpoint", "3", "--confirm-rounds", "1",
                           "--confirm-samples", "1", jobs=2)


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_the_script_records_one_sample_on_every_shape_as_landscapes(bench, recorded) -> None:
    folder, done = recorded
    files = sorted(folder.glob("*.json.gz"))
    assert [f.name for f in files] == ["matmul_example_gemm_fp32_tt_16x48x32.json.gz",
                                       "matmul_example_gemm_fp32_tt_32x32x32.json.gz"]
    space, feasible_ctx = bench.ms.SPACE, ctx("H100", torch.float32)
    keys = []
    for f in files:
        ls = load_landscape(f)
        assert ls.space_name == "matmul_example" and ls.names == space.names
        assert len(ls) == ls.meta["recorded"] == 4
        assert ls.meta["complete"] is False and ls.meta["coverage"]["seed"] == 3
        assert ls.meta["feasible"] == ls.meta["coverage"]["feasible"] == len(FeasibleSet.build(space, feasible_ctx))
        assert "torch.matmul" in ls.baselines
        assert (ls.meta["confirmed"]["points"], ls.meta["confirmed"]["rounds"]) == (4, 1)  # fewer than --confirm-top
        for key, r in ls.entries.items():
            assert space.check(dict(zip(ls.names, key, strict=True)), feasible_ctx) is None
            assert r.status is Status.OK and r.error is not None and r.error < 1e-4, r.message
            assert r.compile_s > 0 and 0 < len(r.samples_ms) <= bench.MAX_SAMPLES
        keys.append(set(ls.entries))
    assert keys[0] == keys[1]  # the same sample on both shapes
    cache = done.stdout.split("compiling with 2 workers into ")[1].split()[0]
    assert "triton_cache_" in cache and not Path(cache).exists()  # the fresh Triton cache is removed at the end


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_max_seconds_stops_after_one_configuration_and_writes_it(tmp_path: Path) -> None:
    # the confirmation at its shortest, as above: what it times is not looked at here
    done = run_script(tmp_path, "--sample", "3", "--max-seconds", "0", "--confirm-rounds", "1",
                      "--confirm-samples", "1")
    assert "--max-seconds 0 reached after 1 configurations" in done.stdout
    points = [set(load_landscape(f).entries) for f in sorted(tmp_path.glob("*.json.gz"))]
    assert len(points) == 2 and len(points[0]) == 1 and points[0] == points[1]


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_a_failing_or_wrong_configuration_is_recorded_failed_and_not_timed(bench) -> None:
    class Counting:
        calls = 0

        def measure(self, call):
            self.calls += 1
            call()
            return 1.0, [1.0]

    shape = bench.Bench.make(bench.Shape(32, 32, 32))
    point = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
    ok = bench.Compiled(0, 0.5)

    def right(grid, args, kwargs):
        torch.matmul(args[0], args[1], out=args[2])

    def wrong(grid, args, kwargs):
        args[2].zero_()

    def raising(grid, args, kwargs):
        raise RuntimeError("launch failed\nsecond line")

    timer = Counting()
    assert bench.measure(shape, point, bench.Compiled(0, 0.5, "CompilationError: x"), timer, right).status \
        is Status.COMPILE_ERROR
    bad = bench.measure(shape, point, ok, timer, wrong)
    assert bad.status is Status.WRONG_RESULT and "relative error" in bad.message
    failed = bench.measure(shape, point, ok, timer, raising)
    assert failed.status is Status.RUNTIME_ERROR and failed.message == "RuntimeError: launch failed"
    assert timer.calls == 0
    good = bench.measure(shape, point, ok, timer, right)
    assert good.status is Status.OK and good.compile_s == 0.5 and timer.calls == 1


def test_bad_shapes_are_refused_with_exit_code_2(bench, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # the script parses its options before anything else (its __main__ block): exit 2 here is the process's
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--shapes", "32x32", "--out", str(tmp_path)])
    assert exited.value.code == 2 and "--shapes: '32x32' is not MxNxK" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_near_optimal_takes_every_point_within_the_margin_and_at_least_the_top(bench) -> None:
    def row(t: float | None) -> tuple[dict, EvalResult]:
        return {}, EvalResult(Status.OK, t) if t is not None else EvalResult(Status.COMPILE_ERROR, message="x")

    rows = [row(1.30), row(1.00), row(None), row(1.05), row(1.11), row(2.0)]
    assert bench.near_optimal(rows, 0.10, 1) == [1, 3]  # 1.11 is just outside 10%; the failed row never counts
    assert bench.near_optimal(rows, 0.10, 4) == [1, 3, 4, 0]  # fastest first
    assert bench.near_optimal([row(None)], 0.10, 3) == []


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_confirm_only_retimes_the_near_optimal_points_and_leaves_the_others(bench, recorded, tmp_path: Path) -> None:
    """On the shared recording's files (a copy): their confirmation (four points, one round) is replaced."""
    for f in recorded[0].glob("*.json.gz"):
        shutil.copy2(f, tmp_path / f.name)
    files = sorted(tmp_path.glob("*.json.gz"))
    before = [load_landscape(f) for f in files]
    assert all((ls.meta["confirmed"]["points"], ls.meta["confirmed"]["rounds"]) == (4, 1) for ls in before)
    run_script(tmp_path, "--confirm-only", "--confirm-within", "0", "--confirm-top", "2", "--confirm-rounds", "2",
               "--confirm-samples", "2")
    for f, old in zip(files, before, strict=True):
        new = load_landscape(f)
        assert new.meta["confirmed"]["points"] == 2 and new.meta["confirmed"]["rounds"] == 2
        assert new.meta["baselines"] == old.meta["baselines"] and set(new.entries) == set(old.entries)
        fastest = sorted(old.entries, key=lambda k: old.entries[k].time_ms)
        assert new.entries[fastest[2]] == old.entries[fastest[2]]  # outside the margin and the top two: untouched
        for key in fastest[:2]:
            assert len(new.entries[key].samples_ms) == 4  # 2 rounds x 2 samples, the median of them its time
            assert new.entries[key].time_ms == pytest.approx(statistics.median(new.entries[key].samples_ms), rel=1e-4)


def test_confirm_only_without_the_recorded_file_is_one_line_and_exit_2(bench, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--confirm-only", "--shapes", "32x32x32", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert err.strip().splitlines()[-1].endswith("matmul_example_gemm_fp32_tt_32x32x32.json.gz: no such file")
    assert not list(tmp_path.iterdir())
