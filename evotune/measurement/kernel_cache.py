"""The compiled-kernel cache on disk, shared by every process of every run on this machine.

Layout (``$EVOTUNE_KERNEL_CACHE``, default ``~/.cache/evotune/kernels``)::

    index.json          {key: {"what": ..., "compile_s": ..., "created": ...}}  (plain JSON)
    builds.log          one line per kernel compiled here: {"key", "pid", "seconds"} (JSON lines)
    locks/<key>.lock    held (flock) by the process compiling ``key``
    cute/<key>.o        CuTe DSL kernels exported as object files (no pickle anywhere)
    cute/<key>.so       the same linked into a shared library, where a C compiler is at hand (loads
                        through tvm-ffi alone)
    triton/             Triton's own cache directory (TRITON_CACHE_DIR points here)

A key is a hash of everything the binary depends on: the backend and its
version, the device, the dtypes and layouts, the configuration and any shape
baked in at compile time. ``index.json`` records what was built so that a
second run can count its hits; writers take a file lock, so several workers
can share the cache.

A kernel is compiled once per cache, whichever process needs it first:
:meth:`KernelCache.build_once` claims the key (an exclusive ``flock`` on its
lock file) before compiling, and another process that needs the same kernel
meanwhile waits for that lock, then finds the kernel built. The kernel
releases a dead compiler's lock, so a killed compile holds nobody up; the next
process compiles the kernel itself. A compile process does not wait
(:func:`never_wait`): it raises :class:`BuiltElsewhere` and takes its next
point, and whoever needs the kernel asks :func:`building` when it is done.

Example::

    cache = KernelCache()
    key = cache.key("triton", triton.__version__, device, problem.dtype, problem.layout, point)
    hit = cache.build_once(key, lambda: compile_into_the_cache(key))
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# index.json path -> ((mtime_ns, size, inode) when parsed, parsed index), per process
_INDEXES: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}
_WAITS = True  # whether build_once waits for another process's compile of its key (never_wait)
_waited = 0.0  # seconds this process has waited for other processes' compiles, all told (waited_s)


class BuiltElsewhere(Exception):
    """:meth:`KernelCache.build_once`, in a process that does not wait, found ``key`` being compiled by another
    process: it holds ``lock``."""

    def __init__(self, key: str, lock: Path):
        super().__init__(f"{key} is being compiled by another process")
        self.key, self.lock = key, lock


def never_wait() -> None:
    """In this process, :meth:`KernelCache.build_once` raises :class:`BuiltElsewhere` where it would wait for
    another process's compile of the same key. For compile processes: one that waits holds a slot of its pool
    that could compile the next point, and the kernel it waits for is built either way."""
    global _WAITS
    _WAITS = False


def waited_s() -> float:
    """Seconds this process has waited, all told, for other processes' compiles of keys it needed (their build
    locks). A caller takes the difference around a build: time spent on a compile it did not make."""
    return _waited


def building(lock: str | Path) -> bool:
    """Whether a process holds ``lock`` (a :class:`BuiltElsewhere`'s) now: compiles its key."""
    try:
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except OSError:  # gone, or unreadable: nobody is compiling into this cache through it
        return False


def cache_root() -> Path:
    return Path(os.environ.get("EVOTUNE_KERNEL_CACHE", Path.home() / ".cache" / "evotune" / "kernels"))


class KernelCache:
    def __init__(self, root: Path | None = None):
        self.root = root or cache_root()
        self.root.mkdir(parents=True, exist_ok=True)
        self.index_path = self.root / "index.json"

    @staticmethod
    def key(*parts: Any) -> str:
        text = json.dumps(parts, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def path(self, backend: str, key: str, suffix: str) -> Path:
        folder = self.root / backend
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{key}{suffix}"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        # has() runs for every point a worker builds and the index holds every kernel ever built here:
        # parse it again only when another process has rewritten it
        try:
            st = self.index_path.stat()
        except OSError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = _INDEXES.get(self.index_path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            index = json.loads(self.index_path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(index, dict):  # not an index evotune wrote: as unreadable as a cut-short one
            return {}
        _INDEXES[self.index_path] = (stamp, index)
        return index

    def has(self, key: str) -> bool:
        return key in self._read()

    @contextmanager
    def claimed(self, key: str, wait: bool = True) -> Iterator[None]:
        """Hold ``key``'s build lock for the block: other processes building ``key`` wait for it meanwhile (and
        count the wait in :func:`waited_s`). Without ``wait``, raise :class:`BuiltElsewhere` where another process
        holds it."""
        global _waited
        folder = self.root / "locks"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{key}.lock"
        with open(path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise BuiltElsewhere(key, path) from None
                started = time.perf_counter()
                fcntl.flock(lock, fcntl.LOCK_EX)  # another process is compiling it: until it is done
                _waited += time.perf_counter() - started
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def build_once(self, key: str, build: Callable[[], object], present: Callable[[], bool] | None = None) -> bool:
        """Compile ``key`` with ``build`` unless it is in the cache; True when it was (a hit, also when another
        process built it while this one waited). ``present`` says whether it is (default: :meth:`has`); a
        space whose files must exist too passes its own check. ``build`` fills the cache and calls :meth:`add`
        (what it returns is ignored). In a process that does not wait (:func:`never_wait`), raises
        :class:`BuiltElsewhere` where another process is compiling ``key``.
        """
        present = present or (lambda: self.has(key))
        if present():
            return True
        with self.claimed(key, wait=_WAITS):
            if present():  # built by another process while this one waited for the lock
                return True
            started = time.perf_counter()
            build()
            self._log_build(key, time.perf_counter() - started)
        return False

    def builds(self) -> list[dict[str, Any]]:
        """Every compile :meth:`build_once` made in this cache, oldest first."""
        try:
            lines = (self.root / "builds.log").read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a killed process
        return out

    def _log_build(self, key: str, seconds: float) -> None:
        line = json.dumps({"key": key, "pid": os.getpid(), "seconds": round(seconds, 3)}) + "\n"
        with self._locked(), open(self.root / "builds.log", "a") as f:
            f.write(line)

    def add(self, key: str, what: str, compile_s: float) -> None:
        with self._locked():
            index = dict(self._read())  # a copy: the parsed index is shared through _INDEXES
            index[key] = {"what": what, "compile_s": round(compile_s, 3), "created": _dt.date.today().isoformat()}
            tmp = self.index_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(index, indent=0, sort_keys=True))
            tmp.replace(self.index_path)
