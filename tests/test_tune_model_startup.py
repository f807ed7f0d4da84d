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


@pytest.mark.slow  # a worker's start-up, torch's import included
def test_the_startup_probe_reports_each_workers_first_evaluation(tmp_path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_model.py"), "startup", "--model",
                          str(ROOT / "tests" / "data" / "tiny_moe_config.json"), "--batch-sizes", "128", "--kernels",
                          "fused_moe", "--gpus", "1", "--importtime", "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    (worker,) = json.loads((tmp_path / "startup.json").read_text())["workers"]
    assert worker["first_evaluation_s"] > 0
    assert "torch" in [name for name, _ in worker["slowest_imports_ms"]]
