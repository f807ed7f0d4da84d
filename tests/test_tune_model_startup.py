"""What a ``tune-model`` worker does before its first evaluation: the storages the parent made and checked are
opened without Alembic's check, the decode family's machinery is imported only for a decode key, and the
benchmark's probe reports the seconds from a worker's start to its first evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evotune.storage.study import CHECKED_ENV, checked_for_children, make_storage

ROOT = Path(__file__).resolve().parents[1]
STANDIN = f"{ROOT / 'tests' / 'model_standin.py'}:make"
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def test_a_storage_the_parent_checked_is_opened_without_checking_it_again(tmp_path, monkeypatch) -> None:
    mine, other = f"sqlite:///{tmp_path / 'run.db'}", f"sqlite:///{tmp_path / 'other.db'}"
    env = checked_for_children([mine])
    assert (tmp_path / "run.db").is_file() and set(env) == {CHECKED_ENV}
    monkeypatch.setenv(CHECKED_ENV, env[CHECKED_ENV])
    assert make_storage(mine).skip_compatibility_check is True
    assert make_storage(other).skip_compatibility_check is False  # not the parent's: checked here


def test_the_default_tuner_imports_the_decode_machinery_only_for_a_decode_key() -> None:
    code = ("import sys; from pathlib import Path; import evotune.model.tuning as t; "
            "from evotune.model.models import load_model; from evotune.model.plan import make_plan; "
            "plan = make_plan(load_model('Llama-3-8B'), 1); tuner = t.AutotuneTuner(plan, Path('.')); "
            "print('evotune.model.study_tuner' in sys.modules, 'evotune.running.confirmation' in sys.modules)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": PYTHONPATH})
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("kernels", ["all", "fused_moe", "triton_decode_gemm"])
def test_a_worker_starts_the_gpu_evaluators_server_with_itself_for_its_later_decode_keys(monkeypatch, kernels) -> None:
    import evotune.model.tuning as t
    from evotune.model.models import load_model
    from evotune.model.plan import make_plan, only, parse_kernels

    done: list[str] = []
    monkeypatch.setattr(t, "_has_gpu", lambda: True)
    monkeypatch.setattr(t, "start_build_processes", lambda *a: done.append("build processes"))
    monkeypatch.setattr(t, "_start_gpu_server", lambda families: done.append(",".join(f.value for f in families)))
    monkeypatch.setattr(t, "_open_gpu", lambda: done.append("cuda"))
    plan = only(make_plan(load_model("Mixtral-8x7B"), 2), parse_kernels(kernels))
    t.AutotuneTuner(plan, Path("."))
    assert done == {"all": ["build processes", "triton_decode_gemm", "cuda"], "fused_moe": ["build processes", "cuda"],
                    "triton_decode_gemm": ["triton_decode_gemm"]}[kernels]


@pytest.mark.slow  # two tune-model runs of two worker processes
def test_the_startup_benchmark_reports_each_workers_first_evaluation_cold_and_warm(tmp_path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH, "STANDIN_SLEEP": "0.1"}  # a key each
    env.pop("CUDA_VISIBLE_DEVICES", None)
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_model.py"), "startup", "--model",
                          str(ROOT / "tests" / "data" / "tiny_moe_config.json"), "--batch-sizes", "1,128",
                          "--gpus", "2", "--tuner", STANDIN, "--out", str(tmp_path)], env=env, capture_output=True,
                         text=True)
    assert got.returncode == 0, got.stderr
    passes = json.loads((tmp_path / "startup.json").read_text())["passes"]
    assert [p["pass"] for p in passes] == ["cold", "warm"]
    for p in passes:
        assert [w["worker"] for w in p["workers"]] == [0, 1]  # each worker recorded its start
        # a worker starts (its fork) after the command and the server's imports
        assert all(0 < w["startup_s"] < w["from_command_s"] < p["wall_s"] for w in p["workers"])
