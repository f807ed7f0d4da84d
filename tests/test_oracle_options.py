"""The ``[oracle]`` table becomes one typed :class:`OracleOptions`, whatever the file leaves out is the default."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from evotune.measurement.options import OracleOptions, TimingOptions
from evotune.running.experiment import ExperimentError, load_experiment

GPU_EXPERIMENT = """
space = "triton_matmul"
hardware = "H100"
[oracle]
kind = "gpu"
{oracle}
[[problem]]
m = 1024
n = 1024
k = 1024
[strategy]
name = "random"
[budget]
trials = 5
"""


def gpu_experiment(tmp_path: Path, oracle: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(GPU_EXPERIMENT.format(oracle=oracle))
    return path


def test_every_key_the_file_sets_lands_in_its_typed_field(tmp_path):
    exp = load_experiment(gpu_experiment(tmp_path, "timeout_s = 60\nworkers = 0\nmin_samples = 10\n"
                                                   "max_samples = 60\nci_target = 1\n"))
    assert exp.oracle_options == OracleOptions(timeout_s=60.0, workers=0,
                                               timing=TimingOptions(min_samples=10, max_samples=60, ci_target=1.0))
    # TOML integers for the float fields become floats, so every consumer sees one type
    assert isinstance(exp.oracle_options.timeout_s, float) and isinstance(exp.oracle_options.timing.ci_target, float)


def test_keys_left_out_take_the_defaults(tmp_path):
    exp = load_experiment(gpu_experiment(tmp_path, "max_samples = 40\n"))
    assert exp.oracle_options == OracleOptions(timing=TimingOptions(max_samples=40))
    assert (exp.oracle_options.timeout_s, exp.oracle_options.workers) == (300.0, None)
    assert exp.oracle_options.timing.min_samples == 20


def test_a_replay_experiment_carries_the_default_options(tmp_path):
    from conftest import replay_experiment

    path = replay_experiment(tmp_path / "exp.toml", name="r", url=f"sqlite:///{tmp_path / 'r.db'}", trials=5)
    assert load_experiment(path).oracle_options == OracleOptions()


def test_a_sample_bound_against_the_other_default_names_the_key_the_file_set(tmp_path):
    with pytest.raises(ExperimentError) as err:
        load_experiment(gpu_experiment(tmp_path, "min_samples = 500\n"))
    assert err.value.field == "oracle.min_samples"
    assert err.value.message == "must be at most max_samples (300, the default)"


def test_the_options_reach_a_worker_process_whole():
    """The GPU worker is a spawned process: what the evaluator hands it is pickled."""
    timing = TimingOptions(min_samples=7, max_samples=9, ci_target=0.2)
    options = OracleOptions(timeout_s=12.5, workers=3, timing=timing)
    again = pickle.loads(pickle.dumps(options))
    assert again == options and again.timing == TimingOptions(7, 9, 0.2)
    with pytest.raises(AttributeError):
        options.timing.min_samples = 1  # frozen: one experiment's options cannot drift while it runs
