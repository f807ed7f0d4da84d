"""The read-ceiling benchmark: its Triton read touches every word once, whatever its block, unrolling and programs
(CPU, Triton's interpreter, in a process of its own: the interpreter is chosen when Triton is imported); its
acceptance table of an experiment, from stand-in ceilings and bests; its bad inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, load_benchmark

CHECK = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from benchmarks.read_ceiling import launch_read
for words, block, unroll, programs in ((4096, 1024, 1, 4), (5000, 1024, 4, 3), (777, 2048, 1, 1), (9001, 1024, 2, 8)):
    src = torch.arange(words, dtype=torch.int32) % 7
    out = torch.full((8,), -1, dtype=torch.int32)
    launch_read(src, out, block, 4, unroll, programs)()
    assert int(out[:programs].sum()) == int(src.sum()), (words, block, unroll, programs, out)
print("ok")
"""


@pytest.mark.slow  # a Triton kernel through the interpreter
def test_the_read_sums_every_word_once():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK, str(ROOT)], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# -- the acceptance table of an experiment, from stand-in ceilings and bests (no GPU)
FP8_DECODE = [ROOT / "experiments" / f"fp8_decode_{s}.toml" for s in ("tensor", "row")]
READ_GBPS = 3000.0


def _read_ms(nbytes: int) -> float:
    return nbytes / (READ_GBPS * 1e6) + 0.003  # a read at 3 TB/s and 3 us of fixed cost


def _stand_in(tmp_path, share_of_read, ratio, drop=0):
    """Ceilings of every size the decode experiments time, and `evotune best` rows whose best takes the read's
    time over ``share_of_read(problem)`` and whose baseline ``ratio(problem)`` times that (the last ``drop``
    problems without a row)."""
    from evotune.running.experiment import load_experiment

    problems = [p for path in FP8_DECODE for p in load_experiment(path).problems]
    sizes = sorted({p.min_bytes for p in problems} | {2**30})
    ceilings = tmp_path / "ceilings.json"
    ceilings.write_text(json.dumps({"read_gbps": READ_GBPS, "device_info": {"name": "stand-in"}, "ceilings": [
        {"bytes": s, "torch_sum_ms": _read_ms(s) * 1.1, "triton_read_ms": _read_ms(s), "pct_read_bw": 90.0}
        for s in sizes]}))
    best = tmp_path / "best.json"
    rows = []
    for p in problems[:len(problems) - drop]:
        time_ms = _read_ms(p.min_bytes) / share_of_read(p)
        rows.append({"problem_key": p.key, "time_ms": time_ms, "confirmed": True,
                     "baselines": {"torch._scaled_mm": time_ms * ratio(p), "slower": time_ms * 9}})
    best.write_text(json.dumps(rows))
    return problems, ceilings, best


def _table(module, tmp_path, ceilings, best, capsys):
    out = tmp_path / "table.json"
    args = [a for path in FP8_DECODE for a in ("--experiment", str(path))]
    code = module.main([*args, "--best", str(best), "--ceilings", str(ceilings), "--out", str(out)])
    return code, capsys.readouterr(), out


@pytest.mark.slow  # two tables over 48 problems: 5 s
def test_the_acceptance_table_holds_large_shapes_to_90_percent_of_their_read(tmp_path, monkeypatch, capsys):
    module = load_benchmark("read_ceiling", monkeypatch)
    big = 64 * 2**20

    def share(p):  # the large shapes at 95% of their read, but one of them at 85%
        return 0.85 if p.key == "gemm_fp8_tn_16x14336x8192_rowscaled" else 0.95 if p.min_bytes >= big else 0.5

    problems, ceilings, best = _stand_in(tmp_path, share, lambda p: 1.1 if p.m == 1 else 1.4)
    code, printed, out = _table(module, tmp_path, ceilings, best, capsys)
    assert code == 0, printed.err
    result = json.loads(out.read_text())
    lines = {ln["problem"]: ln for ln in result["problems"]}
    assert len(lines) == len(problems) == 48
    held = [p.key for p in problems if p.min_bytes >= big]
    assert {k for k, ln in lines.items() if ln["held"]} == set(held) and len(held) == 12  # two shapes, 3 M, 2 scalings
    assert lines["gemm_fp8_tn_16x14336x8192_rowscaled"]["share"] == pytest.approx(0.85)
    assert lines["gemm_fp8_tn_1x4096x4096_tensorscaled"]["ratio"] == pytest.approx(1.1)  # the fastest baseline
    summary = result["summary"]
    assert summary["geomean_ratio"] == pytest.approx((1.1 ** 16 * 1.4 ** 32) ** (1 / 48))
    assert summary["min_ratio"] == pytest.approx(1.1) and summary["confirmed"] == 48
    assert (summary["held"], summary["held_passed"]) == (12, 11)
    assert summary["min_held_share"] == pytest.approx(0.85) and not summary["passed"]
    assert "11 of 12 at 90% of the read or more (smallest 85%)" in printed.out
    assert "of its read: NOT met" in printed.out

    problems, ceilings, best = _stand_in(tmp_path, lambda p: 0.95 if p.min_bytes >= big else 0.5, lambda p: 1.2)
    code, printed, out = _table(module, tmp_path, ceilings, best, capsys)
    assert code == 0 and json.loads(out.read_text())["summary"]["passed"] and "of its read: met" in printed.out


@pytest.mark.slow  # a table over 48 problems: 3 s
def test_a_problem_without_a_confirmed_best_fails_the_acceptance(tmp_path, monkeypatch, capsys):
    module = load_benchmark("read_ceiling", monkeypatch)
    _, ceilings, best = _stand_in(tmp_path, lambda p: 0.95, lambda p: 1.2, drop=2)
    code, printed, out = _table(module, tmp_path, ceilings, best, capsys)
    summary = json.loads(out.read_text())["summary"]
    assert code == 0 and (summary["with_best"], summary["confirmed"]) == (46, 46) and not summary["passed"]
    assert "46 of 48 problems" in printed.out and "of its read: NOT met" in printed.out


@pytest.mark.parametrize(("args", "message"), [
    (["--best", "{tmp}/none.json"], "none.json: --best: no such file"),
    (["--ceilings", "{tmp}/few.json"], "few.json: --ceilings: no ceiling for"),
    (["--sizes", "12 parsecs"], "--sizes: '12 parsecs' is not a size"),
    (["--experiment", "{tmp}/none.toml"], "none.toml: (file): no such file"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, args, message):
    module = load_benchmark("read_ceiling", monkeypatch)
    (tmp_path / "few.json").write_text(json.dumps({"read_gbps": 1.0, "ceilings": [{"bytes": 4096}]}))
    out = tmp_path / "out.json"
    given = ["--experiment", str(FP8_DECODE[0])] if args[0] in ("--best", "--ceilings") else []
    code = module.main([*given, *(a.replace("{tmp}", str(tmp_path)) for a in args), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_sizes_are_read_as_bytes(monkeypatch):
    module = load_benchmark("read_ceiling", monkeypatch)
    assert module.parse_sizes("112MiB, 1.5GiB,4096,8KiB") == [112 * 2**20, 3 * 2**29, 4096, 8192]
