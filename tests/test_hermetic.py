"""The test suite leaves the user's files alone: its caches are its own from the start, in every process it
starts, and what the session-end check compares finds a file written to the checkout or to a cache."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import conftest
import hermetic
import pytest


def _under(path: Path, places: list[Path]) -> bool:
    return any(path.resolve().is_relative_to(p.resolve()) for p in places)


def test_every_cache_is_the_sessions_own_here_and_in_a_child_process() -> None:
    from evotune.core.tuned_cache import tuned_path
    from evotune.measurement.kernel_cache import cache_root
    from evotune.triton_tuning.cache import cache_url

    caches = conftest._SESSION["caches"]
    assert isinstance(caches, list) and caches
    url = cache_url(None)
    assert url is not None and url.startswith("sqlite:///")
    here = [tuned_path(), cache_root(), Path(url.removeprefix("sqlite:///"))]
    child = subprocess.run(
        [sys.executable, "-c", "from evotune.triton_tuning.cache import cache_url\n"
                               "from evotune.core.tuned_cache import tuned_path\n"
                               "from evotune.measurement.kernel_cache import cache_root\n"
                               "print(tuned_path()); print(cache_root()); print(cache_url(None)[10:])"],
        cwd=conftest.ROOT, capture_output=True, text=True, check=True).stdout.split("\n")[:3]
    for path in [*here, *map(Path, child)]:
        assert not _under(path, caches), path


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_check_names_what_was_written_to_the_checkout_and_the_caches(tmp_path: Path) -> None:
    repo, cache = tmp_path / "repo", tmp_path / "home" / ".cache" / "evotune"
    repo.mkdir()
    cache.mkdir(parents=True)
    (cache / "tuned.json").write_text("[]")
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("/runs/\n__pycache__/\n")
    (repo / "kept.py").write_text("x = 1\n")
    (repo / "moved.py").write_text("y = 2\n")
    (repo / "runs").mkdir()
    (repo / "runs" / "old_best.json").write_text("{}")  # the user's, from before
    _git(repo, "add", ".gitignore", "kept.py", "moved.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    _git(repo, "mv", "moved.py", "renamed.py")  # the user's change in progress: listed, not a write
    before = hermetic.snapshot(repo, [cache])
    assert before.checkout is not None and "renamed.py" in before.checkout and "runs/old_best.json" in before.checkout
    assert hermetic.writes(before, hermetic.snapshot(repo, [cache])) == []

    (repo / "runs" / "q_best.json").write_text("{}")
    (repo / "kept.py").write_text("x = 22\n")
    (repo / "runs" / "old_best.json").unlink()
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "kept.cpython.pyc").write_bytes(b"\0")  # the interpreter's, not a test's
    (cache / "tuned.json").write_text('[{"experiment": "q"}]')
    (cache / "autotune").mkdir()
    (cache / "autotune" / "autotune.db").write_bytes(b"")
    assert hermetic.writes(before, hermetic.snapshot(repo, [cache])) == [
        f"cache: {cache / 'autotune' / 'autotune.db'} (written)", f"cache: {cache / 'tuned.json'} (rewritten)",
        "checkout: kept.py (written)", "checkout: runs/old_best.json (removed)", "checkout: runs/q_best.json (written)"]


def test_outside_a_git_checkout_only_the_caches_are_compared(tmp_path: Path) -> None:
    folder, cache = tmp_path / "plain", tmp_path / "cache"
    folder.mkdir()
    cache.mkdir()
    before = hermetic.snapshot(folder, [cache, tmp_path / "missing"])
    assert before.checkout is None
    (folder / "anything").write_text("")
    (cache / "tuned.json").write_text("[]")
    assert hermetic.writes(before, hermetic.snapshot(folder, [cache])) == [f"cache: {cache / 'tuned.json'} (written)"]


def test_the_users_caches_follow_the_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert hermetic.user_caches({}, home) == [home / ".cache" / "evotune"]
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "EVOTUNE_TUNED": str(tmp_path / "t.json"),
           "EVOTUNE_AUTOTUNE_CACHE": str(tmp_path / "at")}
    assert hermetic.user_caches(env, home) == [home / ".cache" / "evotune", tmp_path / "xdg" / "evotune",
                                               tmp_path / "t.json", tmp_path / "at"]
