"""The compiled-kernel cache on disk, shared by every process of every run on this machine.

Layout (``$EVOTUNE_KERNEL_CACHE``, default ``~/.cache/evotune/kernels``)::

    index.json          {key: {"what": ..., "compile_s": ..., "created": ...}}  (plain JSON)
    cute/<key>.o        CuTe DSL kernels exported as object files (no pickle anywhere)
    cute/<key>.so       the same linked into a shared library, where a C compiler is at hand (loads
                        through tvm-ffi alone)
    triton/             Triton's own cache directory (TRITON_CACHE_DIR points here)

A key is a hash of everything the binary depends on: the backend and its
version, the device, the dtypes and layouts, the configuration and any shape
baked in at compile time. ``index.json`` records what was built so that a
second run can count its hits; writers take a file lock, so several workers
can share the cache.

Example::

    cache = KernelCache()
    key = cache.key("triton", triton.__version__, device, problem.dtype, problem.layout, point)
    if cache.has(key): ...
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# index.json path -> ((mtime_ns, size, inode) when parsed, parsed index), per process
_INDEXES: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}


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
    def _locked(self):
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
        _INDEXES[self.index_path] = (stamp, index)
        return index

    def has(self, key: str) -> bool:
        return key in self._read()

    def add(self, key: str, what: str, compile_s: float) -> None:
        with self._locked():
            index = dict(self._read())  # a copy: the parsed index is shared through _INDEXES
            index[key] = {"what": what, "compile_s": round(compile_s, 3), "created": _dt.date.today().isoformat()}
            tmp = self.index_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(index, indent=0, sort_keys=True))
            tmp.replace(self.index_path)
