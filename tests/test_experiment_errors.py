"""A corpus of broken experiment files: each must end ``evotune run`` with exit code 2 and one line on stderr
that names the file and the offending field, with no traceback and nothing written (no storage, no outputs).

Each case is the text of an experiment file (placeholders ``@PNPOLY@``, ``@DB@`` and ``@TMP@`` are filled
in for the test's tmp_path) and the field the error must name, e.g. ``budget.trials``: the line must contain
``PATH: FIELD:``, the format of :class:`evotune.running.experiment.ExperimentError`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evotune import cli

ROOT = Path(__file__).parents[1]
PNPOLY = ROOT / "evotune/landscapes/kerneltuner/pnpoly_RTX_2080_Ti.json.gz"

SPACE = 'space = "landscape"\n'
REPLAY = '[oracle]\nkind = "replay"\nlandscapes = ["@PNPOLY@"]\n'
RANDOM = '[[strategy]]\nname = "random"\n'
BUDGET = "[budget]\ntrials = 5\n"
STORAGE = '[storage]\nurl = "sqlite:///@DB@"\n'
OUTPUTS = '[outputs]\nplots = "@TMP@/plots"\nbest = "@TMP@/best.json"\n'
GPU = '[oracle]\nkind = "gpu"\n'
PROBLEM = '[[problem]]\nm = 1024\nn = 1024\nk = 1024\ndtype = "bf16"\n'
CPU = '[oracle]\nkind = "cpu"\n'
CPU_PROBLEM = '[[problem]]\nm = 64\nn = 64\nk = 64\ndtype = "fp32"\n'
FP8_BLOCK = '[[problem]]\nm = 16\nn = 4096\nk = 7168\ndtype = "fp8"\nscaling = "block"\n'
CONV_PROBLEM = '[[problem]]\nkind = "conv2d"\nN = 1\nC = 32\nH = 4\nW = 4\nK = 32\nR = 3\nS = 3\n'
NO_BUILD = ('from evotune.core.space import SearchSpace, ordinal\n'
            'SPACE = SearchSpace("nobuild", [ordinal("x", (1, 2))])\n')
_DEFAULT = object()


def doc(*, top: str = "", space=_DEFAULT, oracle=_DEFAULT, problem: str = "", strategy=_DEFAULT,
        budget=_DEFAULT, storage=_DEFAULT) -> str:
    """A valid replay experiment over the pnpoly landscape, with the given parts replaced (None: left out)."""
    parts = [top, SPACE if space is _DEFAULT else space, problem,
             REPLAY if oracle is _DEFAULT else oracle,
             RANDOM if strategy is _DEFAULT else strategy,
             BUDGET if budget is _DEFAULT else budget,
             STORAGE if storage is _DEFAULT else storage, OUTPUTS]
    return "\n".join(p for p in parts if p)


def gpu_doc(*, space: str = 'space = "triton_matmul"\n', problem: str = PROBLEM, top: str = "",
            oracle: str = GPU) -> str:
    """A GPU experiment on a built-in space; problems are only accepted with a GPU oracle."""
    return doc(top=top + 'hardware = "H100"\n', space=space, oracle=oracle, problem=problem)


def ga(options: str) -> str:
    return f'[[strategy]]\nname = "ga"\noptions = {options}\n'


KT_DOC = doc(oracle='[oracle]\nkind = "replay"\nlandscapes = ["kt.json"]\n')


def kt(landscape: dict | list) -> dict[str, str | bytes]:
    """``kt.json``, a malformed Kernel Tuner cache file with the given content (KT_DOC replays it)."""
    return {"kt.json": json.dumps(landscape)}


# (case id, experiment text, field the error names, extra files {name relative to tmp_path: content})
CASES: list[tuple[str, str, str, dict[str, str | bytes]]] = [
    # -- the file itself
    ("invalid-toml", doc(top="name = 'unterminated\n"), "(syntax)", {}),
    ("duplicate-key", doc(budget="[budget]\ntrials = 5\ntrials = 6\n"), "(syntax)", {}),
    ("unknown-top-level-field", doc(top='colour = "red"\n'), "colour", {}),
    ("empty-name", doc(top='name = ""\n'), "name", {}),
    # -- space
    ("missing-space", doc(space=None), "space", {}),
    ("unknown-space-name", doc(space='space = "no_such_space"\n'), "space", {}),
    ("space-py-missing", doc(space='space = "spaces/missing.py"\n'), "space", {}),
    ("space-py-without-SPACE", doc(space='space = "nospace.py"\n'), "space", {"nospace.py": "X = 1\n"}),
    ("space-py-raises-on-import", doc(space='space = "broken.py"\n'), "space",
     {"broken.py": "raise RuntimeError('boom')\n"}),
    ("space-py-syntax-error", doc(space='space = "syntax.py"\n'), "space", {"syntax.py": "def (:\n"}),
    ("space-does-not-match-landscape", doc(space='space = "triton_matmul"\n'), "space", {}),
    ("space-py-SPACE-not-a-SearchSpace", doc(space='space = "int.py"\n'), "space", {"int.py": "SPACE = 42\n"}),
    # the CPU oracle builds every point with the space's build(): found out before the storage is opened
    ("space-py-without-build-on-cpu", doc(space='space = "nobuild.py"\n', oracle=CPU, problem=CPU_PROBLEM), "space",
     {"nobuild.py": NO_BUILD}),
    ("space-landscape-with-gpu-oracle", gpu_doc(space=SPACE), "space", {}),
    # -- budget
    ("budget-misspelled-trails", doc(budget="[budget]\ntrails = 5\n"), "budget.trails", {}),
    ("budget-trials-zero", doc(budget="[budget]\ntrials = 0\n"), "budget.trials", {}),
    ("budget-trials-negative", doc(budget="[budget]\ntrials = -3\n"), "budget.trials", {}),
    ("budget-trials-string", doc(budget='[budget]\ntrials = "10"\n'), "budget.trials", {}),
    ("budget-trials-float", doc(budget="[budget]\ntrials = 2.5\n"), "budget.trials", {}),
    ("budget-trials-bool", doc(budget="[budget]\ntrials = true\n"), "budget.trials", {}),
    ("budget-seconds-negative", doc(budget="[budget]\nseconds = -1.0\n"), "budget.seconds", {}),
    ("budget-seconds-string", doc(budget='[budget]\nseconds = "fast"\n'), "budget.seconds", {}),
    # NaN compares false with everything: it would never stop a run (trials keeps this case short if accepted)
    ("budget-seconds-nan", doc(budget="[budget]\ntrials = 5\nseconds = nan\n"), "budget.seconds", {}),
    ("budget-plateau-zero", doc(budget="[budget]\ntrials = 5\nplateau = 0\n"), "budget.plateau", {}),
    ("budget-neither-trials-nor-seconds", doc(budget="[budget]\nplateau = 5\n"), "budget", {}),
    ("budget-missing", doc(budget=None), "budget", {}),
    ("budget-not-a-table", doc(top="budget = 5\n", budget=None), "budget", {}),
    # -- strategy
    ("strategy-missing", doc(strategy=None), "strategy", {}),
    ("strategy-not-a-table", doc(top='strategy = "ga"\n', strategy=None), "strategy", {}),
    ("strategy-unknown-name", doc(strategy='[[strategy]]\nname = "simulated_annealing"\n'), "strategy[0].name", {}),
    ("strategy-single-table-unknown-name", doc(strategy='[strategy]\nname = "sa"\n'), "strategy.name", {}),
    ("strategy-name-missing", doc(strategy="[[strategy]]\nseed = 1\n"), "strategy[0].name", {}),
    ("strategy-unknown-field", doc(strategy='[[strategy]]\nname = "random"\nseeds = 3\n'), "strategy[0].seeds", {}),
    ("strategy-unknown-option-popsize", doc(strategy=ga("{ popsize = 20 }")), "strategy[0].options.popsize", {}),
    ("strategy-seed-negative", doc(strategy='[[strategy]]\nname = "random"\nseed = -1\n'), "strategy[0].seed", {}),
    ("strategy-repeats-zero", doc(strategy='[[strategy]]\nname = "random"\nrepeats = 0\n'),
     "strategy[0].repeats", {}),
    ("strategy-seeding-magic", doc(strategy=ga('{ seeding = "magic" }')), "strategy[0].options.seeding", {}),
    ("strategy-options-not-a-table", doc(strategy=ga("5")), "strategy[0].options", {}),
    ("strategy-second-entry-bad", doc(strategy=RANDOM + '[[strategy]]\nname = "nope"\n'), "strategy[1].name", {}),
    # an option the file accepts by name but the strategy rejects by value
    ("strategy-ga-population-one", doc(strategy=ga("{ population = 1 }")), "strategy[0].options.population", {}),
    ("strategy-ga-population-list", doc(strategy=ga("{ population = [1] }")), "strategy[0].options.population", {}),
    # only used once the first generation is measured: must still be refused before anything is written
    ("strategy-ga-cxpb-string", doc(strategy=ga('{ population = 2, offspring = 1, cxpb = "x" }')),
     "strategy[0].options.cxpb", {}),
    ("strategy-cmaes-popsize-string", doc(strategy='[[strategy]]\nname = "cmaes"\noptions = { popsize = "x" }\n'),
     "strategy[0].options.popsize", {}),
    # -- oracle and landscapes
    ("oracle-unknown-kind", doc(oracle='[oracle]\nkind = "cloud"\n'), "oracle.kind", {}),
    ("oracle-unknown-field", doc(oracle=REPLAY + "workerz = 2\n"), "oracle.workerz", {}),
    ("oracle-not-a-table", doc(oracle='oracle = "replay"\n'), "oracle", {}),
    ("replay-without-landscapes", doc(oracle='[oracle]\nkind = "replay"\n'), "oracle.landscapes", {}),
    ("replay-empty-landscapes", doc(oracle='[oracle]\nkind = "replay"\nlandscapes = []\n'), "oracle.landscapes", {}),
    ("landscape-file-missing", doc(oracle='[oracle]\nkind = "replay"\nlandscapes = ["nope.json.gz"]\n'),
     "oracle.landscapes", {}),
    ("landscape-not-json", doc(oracle='[oracle]\nkind = "replay"\nlandscapes = ["garbage.json"]\n'),
     "oracle.landscapes", {"garbage.json": b"\x00\x01 this is not json {{{"}),
    ("landscape-bad-gzip", doc(oracle='[oracle]\nkind = "replay"\nlandscapes = ["bad.json.gz"]\n'),
     "oracle.landscapes", {"bad.json.gz": b"\x1f\x8b\x08\x00truncated"}),
    ("landscape-neither-format", doc(oracle='[oracle]\nkind = "replay"\nlandscapes = ["other.json"]\n'),
     "oracle.landscapes", {"other.json": '{"hello": "world", "values": [1, 2, 3]}'}),
    ("landscape-kernel-tuner-cache-not-an-object", KT_DOC, "oracle.landscapes",
     kt({"tune_params": {"x": [1, 2]}, "cache": []})),
    ("landscape-kernel-tuner-value-not-a-choice", KT_DOC, "oracle.landscapes",
     kt({"tune_params": {"x": [1, 2]}, "cache": {"3": {"x": 3, "time": 1.0}}})),
    ("landscape-kernel-tuner-row-not-an-object", KT_DOC, "oracle.landscapes",
     kt({"tune_params": {"x": [1, 2]}, "cache": {"1": 5}})),
    ("landscape-kernel-tuner-choices-not-a-list", KT_DOC, "oracle.landscapes",
     kt({"tune_params": {"x": 5}, "cache": {"5": {"x": 5, "time": 1.0}}})),
    ("landscape-kernel-tuner-unknown-key", KT_DOC, "oracle.landscapes",
     kt({"tune_params": {"x": [1, 2]}, "tune_params_keys": ["y"], "cache": {}})),
    ("landscape-kernel-tuner-compile-time-not-a-number", KT_DOC, "oracle.landscapes",
     kt({"tune_params": {"x": [1, 2]}, "cache": {"1": {"x": 1, "time": 1.0, "compile_time": "abc"}}})),
    # a landscape with no recorded point: the file is what is wrong, not the space
    ("landscape-kernel-tuner-empty-cache", KT_DOC, "oracle.landscapes",
     kt({"tune_params": {"x": [1, 2]}, "cache": {}})),
    ("landscape-json-not-an-object", doc(oracle='[oracle]\nkind = "replay"\nlandscapes = ["list.json"]\n'),
     "oracle.landscapes", {"list.json": "[1, 2, 3]"}),
    ("landscapes-with-gpu-oracle", gpu_doc(oracle=GPU + 'landscapes = ["@PNPOLY@"]\n'), "oracle.landscapes", {}),
    ("oracle-timeout-negative", gpu_doc(oracle=GPU + "timeout_s = -5\n"), "oracle.timeout_s", {}),
    ("oracle-workers-string", gpu_doc(oracle=GPU + 'workers = "many"\n'), "oracle.workers", {}),
    ("oracle-workers-with-replay", doc(oracle=REPLAY + "workers = 2\n"), "oracle.workers", {}),
    ("oracle-ci-target-zero", gpu_doc(oracle=GPU + "ci_target = 0\n"), "oracle.ci_target", {}),
    ("oracle-min-samples-zero", gpu_doc(oracle=GPU + "min_samples = 0\n"), "oracle.min_samples", {}),
    ("oracle-max-below-min", gpu_doc(oracle=GPU + "min_samples = 20\nmax_samples = 10\n"), "oracle.max_samples", {}),
    # one side given: checked against the other's default (min_samples 20, max_samples 300)
    ("oracle-max-below-default-min", gpu_doc(oracle=GPU + "max_samples = 10\n"), "oracle.max_samples", {}),
    ("oracle-min-above-default-max", gpu_doc(oracle=GPU + "min_samples = 500\n"), "oracle.min_samples", {}),
    ("oracle-timeout-with-replay", doc(oracle=REPLAY + "timeout_s = 5\n"), "oracle.timeout_s", {}),
    ("oracle-samples-with-replay", doc(oracle=REPLAY + "min_samples = 5\n"), "oracle.min_samples", {}),
    ("oracle-flush-unknown", gpu_doc(oracle=GPU + 'flush = "warm"\n'), "oracle.flush", {}),
    ("oracle-flush-not-a-string", gpu_doc(oracle=GPU + "flush = true\n"), "oracle.flush", {}),
    ("oracle-flush-with-replay", doc(oracle=REPLAY + 'flush = "clean"\n'), "oracle.flush", {}),
    ("oracle-flush-with-cpu", doc(space=f'space = "{ROOT / "tests/spaces/faults.py"}"\n',
                                  oracle=CPU + 'flush = "clean"\n', problem=CPU_PROBLEM), "oracle.flush", {}),
    # -- hardware
    ("hardware-unknown", doc(top='hardware = "H900"\n'), "hardware", {}),
    ("hardware-not-a-string", doc(top="hardware = 100\n"), "hardware", {}),
    # -- problems
    ("problem-negative-m", gpu_doc(problem=PROBLEM.replace("m = 1024", "m = -1024")), "problem[0].m", {}),
    ("problem-zero-n", gpu_doc(problem=PROBLEM.replace("n = 1024", "n = 0")), "problem[0].n", {}),
    ("problem-missing-k", gpu_doc(problem=PROBLEM.replace("k = 1024\n", "")), "problem[0].k", {}),
    ("problem-unknown-dtype", gpu_doc(problem=PROBLEM.replace('"bf16"', '"bf17"')), "problem[0].dtype", {}),
    ("problem-unknown-layout", gpu_doc(problem=PROBLEM + 'layout = "xy"\n'), "problem[0].layout", {}),
    ("problem-unknown-field", gpu_doc(problem=PROBLEM + "batch = 4\n"), "problem[0].batch", {}),
    ("problem-second-entry-bad", gpu_doc(problem=PROBLEM + PROBLEM.replace("m = 1024", 'm = "big"')),
     "problem[1].m", {}),
    ("problem-unknown-kind", gpu_doc(problem=PROBLEM + 'kind = "stencil"\n'), "problem[0].kind", {}),
    ("problem-kind-not-a-string", gpu_doc(problem=PROBLEM + "kind = 3\n"), "problem[0].kind", {}),
    # scaled fp8 GEMMs: scales for fp8 inputs only, block scales over whole 128-element groups, FP8 tensor cores
    ("problem-scaling-on-bf16", gpu_doc(problem=PROBLEM + 'scaling = "row"\n'), "problem[0].scaling", {}),
    ("problem-unknown-scaling", gpu_doc(problem=FP8_BLOCK.replace('"block"', '"channel"')), "problem[0].scaling", {}),
    ("problem-block-scaling-k-not-128", gpu_doc(problem=FP8_BLOCK.replace("k = 7168", "k = 7000")), "problem[0].k",
     {}),
    ("problem-block-scaling-n-not-128", gpu_doc(problem=FP8_BLOCK.replace("n = 4096", "n = 4000")), "problem[0].n",
     {}),
    ("problem-scaled-fp8-layout-nt", gpu_doc(problem=FP8_BLOCK + 'layout = "nt"\n'), "problem[0].layout", {}),
    ("problem-fp8-without-fp8-tensor-cores", doc(top='hardware = "A100"\n', space='space = "triton_matmul"\n',
                                                  oracle=GPU, problem=FP8_BLOCK), "problem[0].dtype", {}),
    # a space serves one workload: a GEMM problem is refused by a space for another kind
    ("space-serves-another-workload", doc(space='space = "other.py"\n', oracle=CPU, problem=CPU_PROBLEM), "space",
     {"other.py": NO_BUILD.replace('ordinal("x", (1, 2))]', 'ordinal("x", (1, 2))], workload="stencil"')}),
    # conv2d problems: the conv2d workload names its own fields
    ("conv-stride-zero", doc(oracle=CPU, problem=CONV_PROBLEM + "stride = 0\n"), "problem[0].stride", {}),
    ("conv-negative-pad", doc(oracle=CPU, problem=CONV_PROBLEM + "pad = -1\n"), "problem[0].pad", {}),
    ("conv-missing-C", doc(oracle=CPU, problem=CONV_PROBLEM.replace("C = 32\n", "")), "problem[0].C", {}),
    ("conv-unknown-layout", doc(oracle=CPU, problem=CONV_PROBLEM + 'layout = "nchw"\n'), "problem[0].layout", {}),
    ("conv-nc32hw32-C-not-32", doc(oracle=CPU, problem=CONV_PROBLEM.replace("C = 32", "C = 48")
                                   + 'dtype = "int8"\nlayout = "nc32hw32"\n'), "problem[0].C", {}),
    ("conv-filter-larger-than-input", doc(oracle=CPU, problem=CONV_PROBLEM.replace("R = 3", "R = 9")),
     "problem[0].R", {}),
    ("conv-scaling-on-fp16", doc(oracle=CPU, problem=CONV_PROBLEM + 'scaling = "channel"\n'),
     "problem[0].scaling", {}),
    ("conv-gemm-field", doc(oracle=CPU, problem=CONV_PROBLEM + "m = 4\n"), "problem[0].m", {}),
    ("problem-missing-with-gpu-oracle", gpu_doc(problem=""), "problem", {}),
    ("problem-with-replay-oracle", doc(problem=PROBLEM), "problem", {}),
    # -- storage and outputs
    ("storage-unsupported-scheme", doc(storage='[storage]\nurl = "redis://x"\n'), "storage.url", {}),
    ("storage-url-not-a-string", doc(storage="[storage]\nurl = 5\n"), "storage.url", {}),
    ("storage-not-a-table", doc(top='storage = "sqlite:///x.db"\n', storage=None), "storage", {}),
    ("storage-unreachable-server", doc(storage='[storage]\nurl = "postgresql://u:p@127.0.0.1:9/db"\n'),
     "storage.url", {}),
    ("outputs-plots-not-a-string", doc().replace('plots = "@TMP@/plots"', "plots = 5"), "outputs.plots", {}),
    ("outputs-best-under-a-file", doc().replace('best = "@TMP@/best.json"', 'best = "@TMP@/afile/best.json"'),
     "outputs.best", {"afile": "a file, where a folder would be made\n"}),
    ("outputs-best-a-folder", doc().replace('best = "@TMP@/best.json"', 'best = "@TMP@"'), "outputs.best", {}),
]


def _write_case(tmp_path: Path, text: str, files: dict[str, str | bytes]) -> tuple[Path, Path]:
    db = tmp_path / "x.db"
    text = text.replace("@PNPOLY@", PNPOLY.as_posix()).replace("@DB@", db.as_posix())
    text = text.replace("@TMP@", tmp_path.as_posix())
    for name, content in files.items():
        target = tmp_path / name
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path, db


def _snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if "__pycache__" not in p.parts}


def _line_problems(stderr: str, path: Path, field: str) -> list[str]:
    """What is wrong with ``stderr`` as the one-line error for ``field`` of ``path`` (empty: nothing)."""
    problems = []
    lines = stderr.splitlines()
    if len(lines) != 1:
        problems.append(f"expected one line on stderr, got {len(lines)}")
    if "Traceback" in stderr:
        problems.append("a traceback on stderr")
    errors = [line for line in lines if line.startswith("evotune: error: ")]
    if not errors:
        problems.append("no line starting with 'evotune: error: '")
    elif f"{path}: {field}:" not in errors[-1]:
        problems.append(f"the error does not name '{path}: {field}:'")
    return problems


def _check_line(stderr: str, path: Path, field: str) -> None:
    problems = _line_problems(stderr, path, field)
    assert not problems, "; ".join(problems) + f"\nstderr:\n{stderr}"


def _assert_refused(tmp_path: Path, capsys, text: str, field: str, files: dict[str, str | bytes],
                    flags: tuple[str, ...] = ("--no-progress", "--no-plots")) -> None:
    """Run the broken experiment in-process; collect every broken requirement, then fail once with all of them."""
    path, db = _write_case(tmp_path, text, files)
    before = _snapshot(tmp_path)
    problems = []
    try:
        code = cli.main(["run", str(path), *flags])
    except BaseException as exc:  # anything but a return is a traceback for the user
        code = None
        problems.append(f"main() raised {type(exc).__name__}: {exc}")
    err = capsys.readouterr().err
    if code is not None:
        if code != 2:
            problems.append(f"exit code {code}")
        problems += _line_problems(err, path, field)
    if db.exists():
        problems.append("the storage file was created")
    changed = sorted(set(_snapshot(tmp_path).items()) ^ set(before.items()))
    if changed:
        problems.append(f"files written or changed: {sorted({name for name, _ in changed})}")
    assert not problems, "; ".join(problems) + f"\nstderr:\n{err}"


@pytest.mark.parametrize(("text", "field", "files"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_broken_experiment_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys, text, field, files):
    monkeypatch.chdir(tmp_path)  # default outputs (under runs/) would land here
    _assert_refused(tmp_path, capsys, text, field, files)


@pytest.mark.parametrize("plots", ["@TMP@/afile", "@TMP@/afile/plots"], ids=["a-file", "under-a-file"])
def test_an_unusable_plots_folder_is_refused_before_the_run(tmp_path, monkeypatch, capsys, plots):
    monkeypatch.chdir(tmp_path)
    _assert_refused(tmp_path, capsys, doc().replace('plots = "@TMP@/plots"', f'plots = "{plots}"'), "outputs.plots",
                    {"afile": "a file\n"}, flags=("--no-progress",))


def test_an_unwritable_outputs_folder_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:  # root writes into any folder: answer as the access check answers any other user
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: (not (mode & os.W_OK) or Path(p) != locked)
                            and access(p, mode))
    try:
        _assert_refused(tmp_path, capsys, doc().replace('best = "@TMP@/best.json"', 'best = "@TMP@/locked/b/x.json"'),
                        "outputs.best", {})
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize(("command", "field"), [("best", "outputs.best"), ("plot", "outputs.plots")])
def test_best_and_plot_refuse_an_unusable_output_of_the_experiment_in_one_line(tmp_path, monkeypatch, capsys,
                                                                                command, field):
    monkeypatch.chdir(tmp_path)
    path, _ = _write_case(tmp_path, doc(), {})
    assert cli.main(["run", str(path), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    (tmp_path / "afile").write_text("a file\n")
    key = field.split(".")[1]
    path.write_text(path.read_text().replace(f'{key} = "{tmp_path}/', f'{key} = "{tmp_path}/afile/'))
    before = _snapshot(tmp_path)
    assert cli.main([command, str(path)]) == 2
    _check_line(capsys.readouterr().err, path, field)
    assert _snapshot(tmp_path) == before
    flag, folder = ("--json", "x.json") if command == "best" else ("--out", "plots")
    assert cli.main([command, str(path), flag, str(tmp_path / "afile" / folder)]) == 2
    assert capsys.readouterr().err.startswith(f"evotune: error: {flag}: cannot write ")


def test_hardware_auto_without_a_gpu(tmp_path, monkeypatch, capsys):
    """'auto' is only resolved when the run starts; finding no GPU is still a one-line error about hardware."""
    from evotune.core import hardware

    def no_gpu(device: int = 0):
        raise RuntimeError("no CUDA GPU found")

    monkeypatch.setattr(hardware, "detect", no_gpu)
    monkeypatch.chdir(tmp_path)
    _assert_refused(tmp_path, capsys, doc(top='hardware = "auto"\n'), "hardware", {})


def test_hardware_auto_without_fp8_tensor_cores(tmp_path, monkeypatch, capsys):
    """'auto' finding a GPU without FP8 tensor cores (an A100) for an fp8 problem: one line about hardware."""
    from evotune.core import hardware

    monkeypatch.setattr(hardware, "detect", lambda device=0: hardware.get_hardware("A100"))
    monkeypatch.chdir(tmp_path)
    text = doc(top='hardware = "auto"\n', space='space = "triton_matmul"\n', oracle=GPU, problem=FP8_BLOCK)
    _assert_refused(tmp_path, capsys, text, "hardware", {})


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_gpu_oracle_without_the_gpu_evaluator(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _assert_refused(tmp_path, capsys, gpu_doc(), "oracle.kind", {})

@pytest.mark.parametrize(("content", "says"), [
    ("SPACE = 42\n", "x.py defines SPACE = 42 (an int), not an evotune.core.space.SearchSpace"),
    ("SPACE = 'gemm'\n", "x.py defines SPACE = 'gemm' (a str), not an evotune.core.space.SearchSpace"),
    ("X = 1\n", "x.py defines no SPACE; it must define SPACE = evotune.core.space.SearchSpace(...)"),
])
def test_a_space_file_is_told_what_is_wrong_with_its_SPACE(tmp_path, monkeypatch, capsys, content, says):
    """Not "unknown space": the file was found and loaded, and what it defines is the problem."""
    monkeypatch.chdir(tmp_path)
    path, _ = _write_case(tmp_path, doc(space='space = "x.py"\n'), {"x.py": content})
    assert cli.main(["run", str(path), "--no-progress", "--no-plots"]) == 2
    err = capsys.readouterr().err
    _check_line(err, path, "space")
    assert says in err


def test_file_does_not_exist(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "missing.toml"
    assert cli.main(["run", str(path), "--no-progress", "--no-plots"]) == 2
    _check_line(capsys.readouterr().err, path, "(file)")
    assert list(tmp_path.iterdir()) == []


def test_path_is_a_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "exp.toml"
    folder.mkdir()
    assert cli.main(["run", str(folder), "--no-progress", "--no-plots"]) == 2
    _check_line(capsys.readouterr().err, folder, "(file)")


def test_the_base_document_is_valid(tmp_path):
    """The corpus is only meaningful if the document each case breaks is itself accepted."""
    from evotune.running.experiment import load_experiment

    path, _ = _write_case(tmp_path, doc(), {})
    exp = load_experiment(path)
    assert (exp.spaces, exp.oracle, exp.budget.trials) == (["landscape"], "replay", 5)
    path, _ = _write_case(tmp_path, gpu_doc(), {})
    exp = load_experiment(path)
    assert (exp.spaces, exp.oracle, exp.problems[0].key) == (["triton_matmul"], "gpu", "gemm_bf16_tn_1024x1024x1024")


SUBPROCESS_CASES = {c[0]: c for c in CASES if c[0] in ("budget-trials-zero", "landscape-not-json")}


@pytest.mark.parametrize("case", sorted(SUBPROCESS_CASES))
def test_real_process_exit_code_and_stderr(tmp_path, case):
    _, text, field, files = SUBPROCESS_CASES[case]
    path, db = _write_case(tmp_path, text, files)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "evotune", "run", str(path), "--no-progress", "--no-plots"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2, proc.stderr
    _check_line(proc.stderr, path, field)
    assert proc.stdout == ""
    assert not db.exists()
