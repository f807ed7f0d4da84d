"""benchmarks/sustained_ranking.py: the same configurations timed short and sustained, on the CPU (interpreter)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("torch")
pytest.importorskip("triton")

import sustained_ranking as sr  # noqa: E402

TINY = ROOT / "tests" / "data" / "tiny_moe_config.json"
SCRIPT = ROOT / "benchmarks" / "sustained_ranking.py"
A = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}
B = {**A, "BLOCK_SIZE_N": 64}


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The script on a smaller tiny MoE (an interpreted launch of the shipped one takes seconds)."""
    cfg = json.loads(TINY.read_text())
    cfg.update(hidden_size=64, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    model = tmp_path / "model" / "config.json"
    model.parent.mkdir(exist_ok=True)
    model.write_text(json.dumps(cfg))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, str(SCRIPT), "--model", str(model), "--m", "16", *args], env=env,
                          capture_output=True, text=True)


def test_each_configuration_is_timed_short_and_sustained_in_every_round(tmp_path) -> None:
    got = _run(tmp_path, "--config", json.dumps(A), "--config", json.dumps(B), "--rounds", "1", "--idle", "0",
               "--load", "0.01", "--out", str(tmp_path / "out"))
    assert got.returncode == 0, got.stderr
    doc = json.loads((tmp_path / "out" / "sustained.json").read_text())
    assert doc["configs"] == {"config#1": A, "config#2": B} and len(doc["rounds"]) == 1
    for r in doc["rounds"]:
        assert set(r) == {"config#1", "config#2"}
        assert all(v["short"] > 0 and v["sustained"] > 0 for v in r.values())
    for name, m in doc["median_ms"].items():
        assert all(m[way] == statistics.median(r[name][way] for r in doc["rounds"]) for way in ("short", "sustained"))
    assert -1.0 <= doc["tau"] <= 1.0 and doc["device"] == "interpreter"
    assert "Kendall's tau" in got.stdout and "sustained rank" in got.stdout


def test_a_bad_configuration_or_too_few_are_one_line_and_nothing_is_written(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    base = ["--model", str(TINY), "--m", "16", "--out", str(out)]
    assert sr.main([*base, "--config", json.dumps({"BLOCK_SIZE_M": 16}), "--config", json.dumps(B)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sustained_ranking: error: --config") and "BLOCK_SIZE_N" in err
    assert sr.main([*base, "--config", json.dumps(A)]) == 2
    assert "at least two configurations" in capsys.readouterr().err
    assert sr.main([*base, "--grid", str(tmp_path / "missing.json"), "--config", json.dumps(A)]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert not out.exists()


def test_the_configurations_come_from_a_grid_comparison_and_a_runs_study(tmp_path) -> None:
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"retime": [{"M": 16, "configs": {"tuned": A, "grid#1": B}}, {"M": 64}]}))
    assert sr.grid_configs(grid, 16) == {"tuned": A, "grid#1": B}
    with pytest.raises(sr.ModelError, match="M = 64"):
        sr.grid_configs(grid, 64)  # a row written before the rows named their configurations
    run = tmp_path / "run"
    run.mkdir()
    storage = optuna.storages.RDBStorage(f"sqlite:///{run / 'autotune.db'}")
    dist = {f: optuna.distributions.CategoricalDistribution((1, 2, 4, 8, 16, 32, 64, 128, 256)) for f in A}
    # a GEMM's study of the same M first (its key has no E), its fastest the other way round
    studies = (("gemm", {"M": 16, "N": 8}, (0.1, 0.3, 0.2)), ("moe", {"M": 16, "E": 4}, (0.3, 0.1, 0.2)))
    for name, fields, values in studies:
        study = optuna.create_study(storage=storage, study_name=name)
        study.set_user_attr("key", fields)
        for value, config in zip(values, (A, B, {**A, "num_warps": 8}), strict=True):
            study.add_trial(optuna.trial.create_trial(params=config, distributions=dist, value=value))
    assert sr.study_configs(run, 16, 2) == {"search#1": B, "search#2": {**A, "num_warps": 8}}
    with pytest.raises(sr.ModelError, match="no fused-MoE study of M = 32"):
        sr.study_configs(run, 32, 2)
