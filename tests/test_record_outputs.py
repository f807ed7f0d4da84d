"""What ``record`` and ``record --compile-only`` write, and where: a missing compiler writes nothing, and the
shipped files under evotune/landscapes are rewritten only when ``--out`` names their folder."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

from conftest import KT_EXCERPT, replay_experiment

from evotune.cli import main
from evotune.core.compile_results import DEFAULT_DIR, file_name
from evotune.core.space import Needs, findable

# a space with a compile_only that runs anywhere; NEEDS is filled in per test
SPACE_PY = '''
from evotune.core.space import Needs, SearchSpace, constraint, ordinal

def compile_only(point, problem, hardware):
    return {{"compile_s": 0.01, "regs": 32 * point["block"], "frame_bytes": 0, "smem": 1024, "stages": 2}}

SPACE = SearchSpace(
    "needy", [ordinal("block", [1, 2, 4, 8])],
    constraints=[constraint("small", lambda p, ctx: p["block"] <= 4, "block {{block}} is too large")],
    compile_only=compile_only, needs=Needs(modules={modules!r}),
)
'''

EXPERIMENT = '''
space = "needy.py"
hardware = "H100"
[oracle]
kind = "gpu"
[[problem]]
m = 64
n = 64
k = 64
[strategy]
name = "random"
[budget]
trials = 5
'''


def _compile_experiment(tmp_path: Path, modules: tuple[str, ...]) -> Path:
    (tmp_path / "needy.py").write_text(SPACE_PY.format(modules=modules))
    exp = tmp_path / "needy.toml"
    exp.write_text(EXPERIMENT)
    return exp


def _rows(path: Path) -> int:
    with gzip.open(path, "rt") as fh:
        return len(json.load(fh)["rows"])


def test_compile_only_without_the_spaces_compiler_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch,
                                                                                         capsys):
    exp = _compile_experiment(tmp_path, ("evotune_no_such_dsl.cute",))
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    assert main(["record", "--compile-only", str(exp)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "needy.toml" in err and "'needy'" in err and "evotune_no_such_dsl.cute" in err
    assert sorted(os.listdir(tmp_path)) == before  # no runs/, no file, no storage


def test_the_cute_dsl_spaces_say_they_need_cute_dsl(capsys, monkeypatch):
    from evotune.core.plugins import load_space

    for name in ("cute_blackwell_gemm", "cute_hopper_gemm"):
        assert "cutlass.cute" in load_space(name).needs.modules
    for name in ("cutlass_sm90_gemm", "cutlass_conv2d_int8", "cutlass_sm90_conv2d_int8"):
        assert "nvcc" in load_space(name).needs.programs
    monkeypatch.setenv("CUTLASS_PATH", "/opt/cutlass")  # the C++ headers from a checkout, no package needed
    assert not any("CUTLASS C++ headers" in m for m in load_space("cutlass_sm90_gemm").needs.missing())
    monkeypatch.delenv("CUTLASS_PATH")
    root = Path(__file__).resolve().parents[1]
    if load_space("cute_blackwell_gemm").needs.missing():  # this machine has no CuTe DSL: refused at once
        assert main(["record", "--compile-only", str(root / "experiments" / "b200_compile.toml"),
                     "--out", "/nonexistent/never-made"]) == 2
        assert "cutlass.cute" in capsys.readouterr().err


def test_compile_only_writes_under_runs_unless_out_names_the_shipped_folder(tmp_path, monkeypatch, capsys):
    exp = _compile_experiment(tmp_path, ("json",))
    monkeypatch.chdir(tmp_path)
    name = file_name("needy", "H100", "bf16", "tn")
    shipped = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in DEFAULT_DIR.iterdir()}
    assert shipped and name not in shipped
    assert main(["record", "--compile-only", str(exp), "--workers", "1"]) == 0
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in DEFAULT_DIR.iterdir()} == shipped  # untouched
    written = tmp_path / "runs" / "compile" / name
    assert Path(capsys.readouterr().out.strip()) == Path("runs/compile") / name
    assert _rows(written) == 4  # the feasible points and the pruned one

    # a rerun planning fewer points (no pruned ones) keeps the rows the file holds
    assert main(["record", "--compile-only", str(exp), "--pruned", "0", "--out", str(written.parent)]) == 0
    assert _rows(written) == 4


def test_record_writes_its_landscapes_under_runs_by_default(tmp_path, monkeypatch, capsys):
    exp = replay_experiment(tmp_path / "rec.toml", name="rec", url=f"sqlite:///{tmp_path / 'rec.db'}", trials=5,
                            landscapes=(KT_EXCERPT,))
    monkeypatch.chdir(tmp_path)
    assert main(["record", str(exp), "--no-progress"]) == 0
    (path,) = (tmp_path / "runs" / "landscapes").glob("*.json.gz")
    assert Path(capsys.readouterr().out.strip().splitlines()[-1]) == Path("runs/landscapes") / path.name
    assert not (tmp_path / "experiments").exists()



def test_record_shows_a_header_a_live_bar_and_labels_both_clocks(tmp_path, capsys):
    exp = replay_experiment(tmp_path / "rec.toml", name="rec", url=f"sqlite:///{tmp_path / 'rec.db'}", trials=5,
                            landscapes=(KT_EXCERPT,))
    assert main(["record", str(exp), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[0].startswith("evotune record rec: space landscape, oracle replay, 1 problem")
    bar = next(ln for ln in lines if " record " in ln and "/" in ln and "best" in ln)
    assert "205/205" in bar and "best 0.01666 ms" in bar  # every point of the excerpt, and the fastest
    closing = " ".join(lines)
    assert "tuning clock" in closing and "wall time" in closing
    assert main(["record", str(exp), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert "205/205" not in capsys.readouterr().err


def test_a_dotted_module_is_found_without_importing_its_package(tmp_path, monkeypatch):
    """A space's needs are checked in the tuner process, which never compiles: finding ``cutlass.cute`` must not
    import ``cutlass`` (CuTe DSL's package imports for seconds)."""
    pkg = tmp_path / "heavy_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "leaf.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert findable("heavy_pkg.sub") and findable("heavy_pkg.leaf") and findable("heavy_pkg")
    assert "heavy_pkg" not in sys.modules
    assert Needs(modules=("heavy_pkg.sub", "heavy_pkg.nothing", "no_such_pkg.sub")).missing() == [
        "Python module heavy_pkg.nothing", "Python module no_such_pkg.sub"]
