"""Shared fixtures: the landscapes shipped with the repository, GPU test skipping, a tuning-result cache per test;
the user's caches and the checkout left alone (:mod:`hermetic`)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import hermetic  # beside this file: pytest puts this folder on sys.path
import pytest

ROOT = Path(__file__).resolve().parents[1]
LANDSCAPES = ROOT / "evotune" / "landscapes" / "kerneltuner"
PNPOLY = LANDSCAPES / "pnpoly_RTX_2080_Ti.json.gz"  # with failed entries
GEMM = LANDSCAPES / "gemm_RTX_2080_Ti.json.gz"
KT_EXCERPT = ROOT / "tests" / "data" / "pnpoly_RTX_2080_Ti_excerpt.json.gz"  # Kernel Tuner format, with failures


def load_benchmark(name: str, monkeypatch: pytest.MonkeyPatch, interpret: bool = False) -> ModuleType:
    """``benchmarks/NAME.py`` as a module, in ``sys.modules`` for the test (its dataclasses look their module up);
    with ``interpret``, under the Triton interpreter (``TRITON_INTERPRET=1`` for the test)."""
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def replay_experiment(path: Path, *, name: str, url: str, trials: int, strategy: str = "ga",
                      seed: int = 0, repeats: int = 1, options: str = "", extra: str = "",
                      landscapes: tuple[Path, ...] = (PNPOLY,), space: str = "landscape") -> Path:
    """Write a replay experiment over shipped landscapes: by default pnpoly's (with failures)."""
    path.write_text(f"""
name = "{name}"
space = "{space}"
[oracle]
kind = "replay"
landscapes = {json.dumps([str(p) for p in landscapes])}
[strategy]
name = "{strategy}"
seed = {seed}
repeats = {repeats}
{f"options = {{ {options} }}" if options else ""}
[budget]
trials = {trials}
[storage]
url = "{url}"
{extra}""")
    return path


H100_INT8 = ROOT / "evotune" / "landscapes" / "h100"  # cute_hopper_gemm_gemm_int8_tn_*.json.gz: 992 points each


def int8_landscapes(count: int) -> list[Path]:
    """The first ``count`` of the recorded int8 H100 landscapes, each of another problem."""
    return sorted(H100_INT8.glob("cute_hopper_gemm_gemm_int8_tn_*.json.gz"))[:count]


def landscape_excerpt(src: Path, dst: Path, points: int) -> Path:
    """Write the first ``points`` points of landscape ``src`` as landscape ``dst``: a small one to record."""
    from evotune.core.landscape import landscape_document, load_landscape, write_landscape

    ls = load_landscape(src)
    rows = [(dict(zip(ls.names, key, strict=True)), r) for key, r in list(ls.entries.items())[:points]]
    return write_landscape(dst, landscape_document(ls.params, rows, ls.problem, ls.meta, ls.space_name))


def copy_checkout(dst: Path) -> Path:
    """The repository as a fresh clone of this working tree would hold it once committed: its tracked files and
    the untracked ones git does not ignore, as they are now, in a new git repository of one commit (so that
    ``git status`` there says what a command changed). Skips the test outside a git checkout."""
    git = ["git", "-c", "user.name=evotune", "-c", "user.email=evotune@localhost", "-c", "commit.gpgsign=false"]
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():  # a tracked file deleted in the working tree is left out
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "--no-verify", "-m", "checkout"]):
        subprocess.run([*git, *args], cwd=dst, check=True, capture_output=True)
    return dst


@dataclass
class Checkout:
    """A fresh clone of the repository, and a tuning-result cache of its own for the commands run in it."""

    path: Path
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess:
        """``python ARGS`` in the clone, as a user runs README's commands there (its own evotune imported)."""
        proc = subprocess.run([sys.executable, *args], cwd=self.path, env=self.env, capture_output=True, text=True,
                              timeout=1800)  # a hang guard, not a time limit
        assert proc.returncode == 0, proc.stderr
        return proc


#: README's quickstart, as README shows it
QUICKSTART_COMMAND = "python -m evotune run experiments/quickstart.toml"


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory) -> tuple[Checkout, subprocess.CompletedProcess]:
    """A fresh clone with README's quickstart command run in it once: the quickstart's tests and the documented
    commands' share the clone and the run (it takes ~20 s); the documented commands' test counts the command as
    run there."""
    root = tmp_path_factory.mktemp("quickstart")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["EVOTUNE_TUNED"] = str(root / "tuned.json")
    checkout = Checkout(copy_checkout(root / "checkout"), env)
    started = time.monotonic()
    proc = checkout.run(*QUICKSTART_COMMAND.split()[1:])
    print(f"quickstart: {time.monotonic() - started:.1f} s on this machine")
    return checkout, proc


def git_status(checkout: Path) -> str:
    """``git status --porcelain`` of ``checkout``: empty when nothing was changed, added or deleted."""
    return subprocess.run(["git", "status", "--porcelain"], cwd=checkout, capture_output=True, text=True,
                          check=True).stdout


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run pytest -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pnpoly():
    from evotune.core.landscape import load_landscape

    return load_landscape(PNPOLY)


@pytest.fixture(scope="session")
def gemm_landscape():
    from evotune.core.landscape import load_landscape

    return load_landscape(GEMM)


@pytest.fixture(autouse=True)
def _own_tuning_cache(tmp_path_factory, monkeypatch):
    """Every test writes and reads a tuning-result cache of its own (runs of every oracle write one), never
    the user's ~/.cache/evotune/tuned.json; subprocesses inherit it."""
    monkeypatch.setenv("EVOTUNE_TUNED", str(tmp_path_factory.mktemp("cache") / "tuned.json"))


_SESSION: dict[str, object] = {}
#: what the controller of a pytest-xdist run (``-n``) tells its workers through their environment: the user's
#: caches it compares at the end, and the terminal size it was given. A worker starts with COLUMNS=80 and LINES=24
#: set, which would make evotune's commands wrap their lines at 80 columns where a plain run prints 130.
_CONTROLLER = "EVOTUNE_TESTS_CONTROLLER"
_TERMINAL = ("COLUMNS", "LINES")


def pytest_configure(config: pytest.Config) -> None:
    """Before any test or fixture runs (session fixtures and test modules' imports included): every cache evotune
    keeps under the home folder points at a folder of the session's own, in this process and every process it
    starts, and the checkout and the user's caches are listed, to be compared when the session ends."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller set the environment it inherits
        told = json.loads(os.environ.get(_CONTROLLER, "{}"))
        for name in _TERMINAL:
            if told.get(name) is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = told[name]
        _SESSION["caches"] = [Path(c) for c in told.get("caches", [])]
        if "hypothesis" in told:
            _hypothesis_home(Path(told["hypothesis"]))
        return
    caches = hermetic.user_caches(os.environ, Path.home())
    own = Path(tempfile.mkdtemp(prefix="evotune-tests-"))
    os.environ.update({"EVOTUNE_TUNED": str(own / "tuned.json"), "EVOTUNE_KERNEL_CACHE": str(own / "kernels"),
                       "EVOTUNE_AUTOTUNE_CACHE": str(own / "autotune"), "XDG_CACHE_HOME": str(own / "xdg")})
    _hypothesis_home(own / "hypothesis")
    os.environ[_CONTROLLER] = json.dumps({"caches": [str(c) for c in caches], "hypothesis": str(own / "hypothesis"),
                                          **{name: os.environ.get(name) for name in _TERMINAL}})
    _SESSION.update(own=own, caches=caches, before=hermetic.snapshot(ROOT, caches))


def _hypothesis_home(folder: Path) -> None:
    """Hypothesis keeps its examples, and what it learns of the code's constants, in .hypothesis/ of the current
    folder unless told otherwise: here, ``folder``."""
    try:
        from hypothesis import settings
        from hypothesis.configuration import set_hypothesis_home_dir
        from hypothesis.database import DirectoryBasedExampleDatabase
    except ImportError:
        return
    set_hypothesis_home_dir(folder)
    settings.register_profile("evotune-tests", database=DirectoryBasedExampleDatabase(folder))
    settings.load_profile("evotune-tests")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The session fails, naming the files, if it wrote to the checkout or to the user's caches."""
    before = _SESSION.get("before")
    if not isinstance(before, hermetic.Snapshot):
        return
    caches = _SESSION["caches"]
    assert isinstance(caches, list)
    found = hermetic.writes(before, hermetic.snapshot(ROOT, caches))
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["the tests wrote outside their temporary folders (a test, or another process meanwhile):",
             *(f"  {line}" for line in found)]
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line("\n".join(lines), red=True, bold=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    own = _SESSION.pop("own", None)
    if isinstance(own, Path):
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture
def kernels() -> ModuleType:
    """The small Triton kernels of the evotune.autotune tests (``tests/autotune_kernels.py``), their benchmark
    counter at 0."""
    tests = str(Path(__file__).resolve().parent)
    sys.path.insert(0, tests)
    try:
        module = importlib.import_module("autotune_kernels")
    finally:
        sys.path.remove(tests)
    module.counting_bench.calls = 0
    return module
