"""The test suite leaves the user's files alone: what it checks before and after a session.

``conftest.py`` points every cache evotune keeps under the home folder (the tuning-result cache, the kernel
cache, the ``evotune.autotune`` cache, anything under ``$XDG_CACHE_HOME``) at a folder of the session's own
before any test or fixture runs, and at the end compares two snapshots taken with :func:`snapshot`: the
checkout's files that git reports (changed, untracked or ignored, so ``runs/`` too) and the files of the
user's caches. A file added, changed or removed there fails the session, named.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# written by the tools that run the tests, not by a test
TOOL_FOLDERS = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache")
CACHE_VARIABLES = ("EVOTUNE_TUNED", "EVOTUNE_KERNEL_CACHE", "EVOTUNE_AUTOTUNE_CACHE")

Stat = tuple[int, int]  # size, modification time in ns


@dataclass(frozen=True)
class Snapshot:
    checkout: dict[str, Stat] | None  # None: not a git checkout (nothing to compare there)
    caches: dict[str, Stat]


def user_caches(environ: dict[str, str] | os._Environ[str], home: Path) -> list[Path]:
    """Where evotune keeps its caches for this user, as ``environ`` says before the tests redirect them."""
    xdg = environ.get("XDG_CACHE_HOME") or str(home / ".cache")
    places = [home / ".cache" / "evotune", Path(xdg) / "evotune"]
    places += [Path(environ[v]).expanduser() for v in CACHE_VARIABLES if environ.get(v)]
    return list(dict.fromkeys(places))


def _stat(path: Path) -> Stat | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def checkout_files(root: Path) -> dict[str, Stat] | None:
    """The files of the checkout at ``root`` that git reports as changed, untracked or ignored, with their
    stat; None where ``root`` is not in a git checkout or git is not installed."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "-z", "--ignored", "--untracked-files=all", "."],
                              cwd=root, capture_output=True, check=False)
    except OSError:
        return None
    if done.returncode != 0:
        return None
    top = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip())
    entries = done.stdout.decode(errors="surrogateescape").split("\0")
    files: dict[str, Stat] = {}
    skip = False
    for entry in entries:
        if skip:  # the source of a rename, which follows its entry
            skip = False
            continue
        if len(entry) < 4:
            continue
        status, name = entry[:2], entry[3:]
        skip = "R" in status or "C" in status
        if any(part in TOOL_FOLDERS for part in Path(name).parts):
            continue
        st = _stat(top / name)
        files[name] = st if st is not None else (-1, -1)  # deleted: listed, with no stat
    return files


def tree_files(places: Iterable[Path]) -> dict[str, Stat]:
    """Every file under ``places`` (files or folders), with its stat."""
    files: dict[str, Stat] = {}
    for place in places:
        if place.is_file():
            st = _stat(place)
            if st is not None:
                files[str(place)] = st
            continue
        for folder, _, names in os.walk(place):
            for name in names:
                path = Path(folder) / name
                st = _stat(path)
                if st is not None:
                    files[str(path)] = st
    return files


def snapshot(root: Path, caches: list[Path]) -> Snapshot:
    return Snapshot(checkout_files(root), tree_files(caches))


def changed(before: dict[str, Stat], after: dict[str, Stat]) -> list[str]:
    """The files written or removed between two listings, each with what happened to it: ``written`` where it
    was not listed before (a new file, or a tracked file git now reports changed), ``rewritten`` where its size
    or time changed, ``removed`` where it is no longer listed."""
    out = []
    for name in sorted(before.keys() | after.keys()):
        if name not in before:
            out.append(f"{name} (written)")
        elif name not in after:
            out.append(f"{name} (removed)")
        elif before[name] != after[name]:
            out.append(f"{name} (rewritten)")
    return out


def writes(before: Snapshot, after: Snapshot) -> list[str]:
    """What the session wrote to the checkout or to the user's caches; empty when it left them alone."""
    found = [f"cache: {c}" for c in changed(before.caches, after.caches)]
    if before.checkout is not None and after.checkout is not None:
        found += [f"checkout: {c}" for c in changed(before.checkout, after.checkout)]
    return found
