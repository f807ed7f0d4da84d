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


@pytest.fixture
def kernels():
    sys.path.insert(0, str(TESTS))
    try:
        module = importlib.import_module("autotune_kernels")
    finally:
        sys.path.remove(str(TESTS))
    module.counting_bench.calls = 0
    return module


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
