"""evotune.autotune's cache file and its commands as a user meets them (CPU, Triton's interpreter): the ``.db``
alone deploys the decisions, ``tune-kernel`` says what it does, and its errors are one line."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

TESTS = Path(__file__).resolve().parent
ADD_TUNED = f"{TESTS / 'autotune_kernels.py'}:add_tuned"


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("RANK", raising=False)


def test_the_db_file_alone_holds_the_decision_while_the_tuning_process_goes_on(kernels, tmp_path: Path) -> None:
    import evotune

    tuned = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                             cache=tmp_path / "cache")(kernels.add)
    tuned[kernels.grid_1d(32)](torch.ones(32), torch.ones(32), torch.empty(32), 32)
    timed = kernels.counting_bench.calls
    assert timed >= 3
    deployed = tmp_path / "deployed"
    deployed.mkdir()
    shutil.copy(tmp_path / "cache" / "autotune.db", deployed / "autotune.db")  # the file alone, not its log
    again = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                             cache=deployed, mode="cache-only")(kernels.add)
    out = torch.empty(32)
    again[kernels.grid_1d(32)](torch.ones(32), torch.ones(32), out, 32)
    assert kernels.counting_bench.calls == timed and torch.equal(out, torch.full((32,), 2.0))
    assert again.best_config.all_kwargs() == tuned.best_config.all_kwargs()
    assert again.last_decision.how == tuned.last_decision.how == "confirmed"


def test_tune_kernel_says_each_key_as_it_starts_and_is_decided(tmp_path: Path, capsys) -> None:
    from evotune.cli import main

    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_add_args"\n[[key]]\nn = 32\n[[key]]\nn = 48\n')
    cache = tmp_path / "cache"
    assert main(["tune-kernel", ADD_TUNED, "--keys", str(keys), "--cache", str(cache)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["key 1/2 (n=32)"] * 2 + ["key 2/2 (n=48)"] * 2
    assert lines[0].endswith(": tuning") and lines[2].endswith(": tuning")
    for line in (lines[1], lines[3]):  # evaluations (all new), best time, how, seconds
        assert " 3 evaluations (3 new), best " in line and " ms, confirmed, " in line and line.endswith(" s")
    assert main(["tune-kernel", ADD_TUNED, "--keys", str(keys), "--cache", str(cache)]) == 0
    again = capsys.readouterr().err.splitlines()
    assert len(again) == 4 and "3 evaluations (0 new)" in again[1] and "3 evaluations (0 new)" in again[3]
    assert main(["tune-kernel", ADD_TUNED, "--keys", str(keys), "--cache", str(cache), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "n=32" in captured.out and "n=48" in captured.out  # the table alone


@pytest.mark.parametrize(("text", "message"), [
    ('n = "32"', "key[1].n: expected an integer (make_add_args's n: int), got '32'"),
    ("n = 1.5", "key[1].n: expected an integer (make_add_args's n: int), got 1.5"),
    ("n = true", "key[1].n: expected an integer (make_add_args's n: int), got True"),
    ("n = -1", "key[1]: make_add_args(**key[1]) failed: RuntimeError: "),  # a value the function refuses
])
def test_a_key_of_the_wrong_type_is_one_line_and_nothing_is_tuned(tmp_path: Path, capsys, text: str,
                                                                   message: str) -> None:
    from evotune.cli import main

    keys = tmp_path / "keys.toml"
    keys.write_text(f'launch = "make_add_args"\n[[key]]\nn = 16\n[[key]]\n{text}\n')
    assert main(["tune-kernel", ADD_TUNED, "--keys", str(keys), "--cache", str(tmp_path / "cache")]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"evotune: error: {keys}: {message}"), line
    assert captured.out == "" and not (tmp_path / "cache").exists()  # key[0] was not tuned either


def test_tune_kernel_without_a_gpu_or_the_interpreter_says_to_set_triton_interpret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Triton with no driver (as on a machine without a GPU) fails its first launch with '0 active drivers';
    tune-kernel says what to do instead, in one line, and creates nothing."""
    from evotune.cli import main

    triton_driver = importlib.import_module("triton.runtime.driver")  # the module (triton.runtime.driver is
    # also the name of its DriverConfig object, which finds the driver on first use)

    def no_driver():
        raise RuntimeError("0 active drivers ([]). There should only be one.")

    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(triton_driver, "_create_driver", no_driver)
    monkeypatch.setattr(triton_driver.driver, "_active", None)
    monkeypatch.setattr(triton_driver.driver, "_default", None)
    module = tmp_path / "kernels_without_a_gpu.py"  # loaded afresh without the interpreter, under its own name
    shutil.copy(TESTS / "autotune_kernels.py", module)
    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_add_args"\n[[key]]\nn = 32\n')
    try:
        assert main(["tune-kernel", f"{module}:add_tuned", "--keys", str(keys), "--cache",
                     str(tmp_path / "cache")]) == 2
    finally:
        sys.modules.pop(module.stem, None)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("evotune: error: no GPU found: set TRITON_INTERPRET=1 to run on the CPU through "
                           "Triton's interpreter (Triton says: 0 active drivers")
    assert not (tmp_path / "cache").exists()


RUN_AS_MAIN = """
import json, runpy, sys
codes = []
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="__main__")
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code)
print(json.dumps(codes))
"""


@pytest.mark.slow  # about 2.8 s: kept out of the fast lane (its 3-minute margin)
def test_the_autotune_examples_without_a_gpu_or_the_interpreter_say_to_set_triton_interpret() -> None:
    """Both scripts run as ``python examples/triton_autotune/NAME.py`` does, in one process (one import of torch
    and Triton), with no GPU visible and the interpreter off."""
    import json
    import os
    import subprocess

    root = TESTS.parent
    examples = ["matmul.py", "fused_moe.py"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(filter(None, [str(root),
                                                                                 env.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", RUN_AS_MAIN,
                           *(str(root / "examples" / "triton_autotune" / e) for e in examples)],
                          env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and json.loads(done.stdout) == [2, 2], done.stderr
    assert done.stderr.splitlines() == [f"{e}: no GPU found: set TRITON_INTERPRET=1 to run on the CPU through "
                                        "Triton's interpreter" for e in examples]

def test_export_configs_from_a_missing_or_empty_cache_says_what_fills_it(kernels, tmp_path: Path, capsys) -> None:
    import evotune
    from evotune.cli import main

    filled_by = "(it is filled by python -m evotune tune-kernel, or by running a program whose kernels use " \
                "evotune.autotune)"
    missing = tmp_path / "missing"
    assert main(["export-configs", "--cache", str(missing), "--out", str(tmp_path / "x.json")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"evotune: error: --cache: no autotune cache at {missing / 'autotune.db'} {filled_by}"
    assert main(["export-configs", "--cache", f"journal:{tmp_path / 'none.journal'}"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"no autotune cache at {tmp_path / 'none.journal'} {filled_by}")
    assert not missing.exists() and not (tmp_path / "x.json").exists()

    tuned = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                             cache=tmp_path / "cache")(kernels.add)
    tuned[kernels.grid_1d(16)](torch.ones(16), torch.ones(16), torch.empty(16), 16)
    assert main(["export-configs", "--cache", str(tmp_path / "cache"), "--kernel", "other"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(f"autotune.db holds no tuned kernel named other {filled_by}")


def test_tune_kernel_counts_the_gpus_timing_seconds_of_each_key_apart_from_its_wall(tmp_path: Path) -> None:
    """A key's ``timing_s``: its new evaluations' timing and the confirmation's rounds, within its seconds; a key
    decided before times nothing."""
    from evotune.triton_tuning.ahead import KeyProgress, Stage, tune_kernel

    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_add_args"\n[[key]]\nn = 32\n')
    cache = str(tmp_path / "cache")
    events: list[KeyProgress] = []
    tune_kernel(ADD_TUNED, keys, cache, progress=events.append)
    (done,) = [e for e in events if e.stage is Stage.DECIDED]
    assert done.new == 3 and 0 < done.timing_s <= done.seconds
    assert done.decision is not None and done.decision.confirmation is not None
    assert done.timing_s > float(done.decision.confirmation["seconds"]) > 0  # the trials' timing counted too
    events.clear()
    tune_kernel(ADD_TUNED, keys, cache, progress=events.append)
    (again,) = [e for e in events if e.stage is Stage.DECIDED]
    assert again.new == 0 and again.timing_s == 0.0


def test_tune_kernel_tells_each_key_the_keys_tuned_after_it(tmp_path: Path, monkeypatch) -> None:
    """What the build processes build ahead while a key is searched: the file's later keys and the keys the caller
    tunes next (tune-model's plan), as the kernel keys them (this key's fields with the later key's values)."""
    from evotune.triton_tuning.ahead import tune_kernel
    from evotune.triton_tuning.autotuner import Autotuner

    seen: list[list[dict]] = []
    tune = Autotuner._tune

    def spy(self, fields, args, kwargs):
        seen.append([dict(u) for u in self.upcoming])
        assert all(set(u) == set(fields) and {**u, "n": fields["n"]} == fields for u in self.upcoming)
        return tune(self, fields, args, kwargs)

    monkeypatch.setattr(Autotuner, "_tune", spy)
    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_add_args"\n[[key]]\nn = 32\n[[key]]\nn = 64\n')
    tune_kernel(ADD_TUNED, keys, str(tmp_path / "cache"), upcoming=[{"n": 128, "other": 1}])
    assert [[u["n"] for u in later] for later in seen] == [[64, 128], [128]]  # each a copy of the key's fields
