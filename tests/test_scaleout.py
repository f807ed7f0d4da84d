"""benchmarks/scaleout.py on the CPU: several workers replay the recorded int8 landscapes, tuning or recording."""

from __future__ import annotations

import importlib.util
import json
import sys

from conftest import ROOT


def scaleout():
    spec = importlib.util.spec_from_file_location("scaleout", ROOT / "benchmarks" / "scaleout.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_tuning_with_one_and_two_workers_is_exact_and_tabled(tmp_path, capsys):
    out = tmp_path / "runs.json"
    code = scaleout().main([str(ROOT / "experiments" / "scaleout_int8.toml"), "--cpu", "--workers", "1,2",
                            "--problems", "3", "--trials", "12", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert [r["workers"] for r in doc["runs"]] == [1, 2] and doc["problems"] == 3 and doc["evals"] == 12
    for r in doc["runs"]:
        assert r["exact"] and r["duplicates"] == 0 and list(r["trials"].values()) == [12, 12, 12]
        assert sum(c["evals"] for c in r["costs"]) == 36 and len(r["costs"]) == r["workers"]
    one = doc["runs"][0]["costs"][0]
    assert len(one["problems_s"]) == 3 and one["model"]["per_eval_s"] > 0  # the lone worker took up each once
    printed = capsys.readouterr().out
    assert "| workers | split | wall time (s) | trials (studies) | exact | duplicates | speed-up |" in printed
    assert "| 2 | problems |" in printed and "per problem" in printed


def test_recording_is_split_across_workers_and_complete(tmp_path, capsys):
    out = tmp_path / "runs.json"
    code = scaleout().main([str(ROOT / "experiments" / "scaleout_record_int8.toml"), "--cpu", "--record",
                            "--workers", "2", "--points", "25", "--json", str(out)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["workers"] for r in runs] == [1, 2]  # one count alone runs with one worker too, for the speed-up
    for run in runs:
        assert run["exact"] and run["incomplete"] == [] and list(run["trials"].values()) == [25] * 4
    assert "recording every feasible point" in capsys.readouterr().out
