"""The tuning-result cache: one plain JSON file of the best configuration per (space, GPU, oracle, problem).

Every ``evotune run`` (and ``evotune best``) merges the best configuration of
each problem into one plain JSON file, so a program can ask for the best known
kernel without opening any study. The file (``$EVOTUNE_TUNED``, default
``~/.cache/evotune/tuned.json``) is a list of objects::

    {"space": "cute_hopper_gemm", "hardware": "NVIDIA H200", "oracle": "gpu",
     "problem_key": "gemm_bf16_tn_4096x4096x4096", "problem": {...},
     "config": {"tile_m": 128, "cluster": "2x1", ...}, "time_ms": 0.178,
     "experiment": "h100_bf16_gemm", "study": "...", "storage": "sqlite:///...", "updated": "2026-11-21"}

``oracle`` says what timed it: ``gpu`` (measured on the GPU named by ``hardware``),
``cpu`` (the CPU oracle: numpy kernels timed on the host) or ``replay`` (a recorded
landscape replayed: the times recorded on its device). Entries without one are
``gpu``. ``lookup`` answers from one oracle's entries, GPU measurements unless told
otherwise, so a replayed or CPU time never stands for a measured one. ``config`` is
kept as Optuna stores it (tuples as ``"2x1"``); ``lookup`` hands it back as the
space's kernel takes it (``(2, 1)``).

A file that is not such a list (not JSON, cut short, an entry without its fields)
is never overwritten: ``run`` and ``best`` (:func:`load_tuned`) set it aside as
``tuned.json.corrupt-N``, say so in one line, and start a new one; ``lookup`` refuses
it (:class:`CacheUnreadable`).

:func:`evotune.lookup` and :func:`evotune.compile_best` read it; transfer takes its entries as sources.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ORACLES = ("gpu", "cpu", "replay")


def tuned_path() -> Path:
    return Path(os.environ.get("EVOTUNE_TUNED", Path.home() / ".cache" / "evotune" / "tuned.json"))


class CacheUnreadable(ValueError):
    """A cache file that is not a list of entries; ``str()`` names the file and says why."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{path}: not a tuning-result cache ({reason})")


@dataclass(frozen=True)
class SetAside:
    """An unreadable cache file, moved out of the way (``kept``) so that a new one starts where it was (``path``)."""

    path: Path
    kept: Path
    reason: str

    def __str__(self) -> str:
        return (f"{self.path}: the tuning-result cache is unreadable ({self.reason}); it is kept as {self.kept.name} "
                "and a new one is started")


@dataclass(frozen=True)
class TunedCache:
    """The cache's entries as read from ``path``; ``set_aside``: the unreadable file found there, if any."""

    path: Path
    entries: list[dict[str, Any]]
    set_aside: SetAside | None = None


#: what each entry must hold, and of what type, for a run to merge into it and transfer and lookup to read it
REQUIRED: dict[str, type | tuple[type, ...]] = {"space": str, "problem_key": str, "problem": dict, "config": dict,
                                               "time_ms": (int, float)}


def read_tuned(path: Path | None = None) -> list[dict[str, Any]]:
    """The cache's entries ([] where there is no file); :class:`CacheUnreadable` for a file that holds none."""
    path = path or tuned_path()
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_bytes())
    except ValueError as exc:  # not JSON, cut short, not UTF-8
        raise CacheUnreadable(path, f"not JSON: {exc}") from None
    if not isinstance(data, list):
        raise CacheUnreadable(path, f"a JSON {type(data).__name__}, not a list of entries")
    for i, e in enumerate(data):
        missing = [k for k, kind in REQUIRED.items() if not isinstance(e, dict) or not isinstance(e.get(k), kind)]
        if missing:
            raise CacheUnreadable(path, f"entry {i} lacks {', '.join(missing)}")
    return data


def load_tuned(path: Path | None = None) -> TunedCache:
    """The cache's entries; an unreadable file is set aside (renamed ``NAME.corrupt-N``, nothing of it lost) and
    the cache starts empty, which ``set_aside`` says."""
    path = path or tuned_path()
    try:
        return TunedCache(path, read_tuned(path))
    except CacheUnreadable as exc:
        try:  # another process may have set it aside and started a new one since
            return TunedCache(path, read_tuned(path))
        except CacheUnreadable:
            return TunedCache(path, [], _set_aside(path, exc.reason))


def _set_aside(path: Path, reason: str) -> SetAside | None:
    """Rename ``path`` to its first free ``NAME.corrupt-N``; None where another process moved it first."""
    n = 1
    while path.with_name(f"{path.name}.corrupt-{n}").exists():
        n += 1
    kept = path.with_name(f"{path.name}.corrupt-{n}")
    try:
        os.link(path, kept)  # never over a file of that name, should one appear meanwhile
        os.unlink(path)
    except FileNotFoundError:  # set aside by another process already
        return None
    except FileExistsError:
        return _set_aside(path, reason)
    except OSError:  # a file system without hard links
        path.rename(kept)
    return SetAside(path, kept, reason)


def remember(rows: Iterable[Any], storage: str, path: Path | None = None) -> TunedCache:
    """Merge ``report.Best`` rows into the cache: one entry per (space, hardware, oracle, problem), the fastest
    kept. The cache as written, and the unreadable file it replaced, if any (:func:`load_tuned`)."""
    cache = load_tuned(path)
    path = cache.path
    entries = {_entry_key(e): e for e in cache.entries}
    today = _dt.date.today().isoformat()
    for b in rows:
        entry = {"space": b.space, "hardware": b.hardware, "oracle": b.oracle, "problem_key": b.problem_key,
                 "problem": b.problem, "config": b.config, "time_ms": b.time_ms, "experiment": b.experiment,
                 "study": b.study, "storage": storage, "updated": today}
        if getattr(b, "space_source", "") not in ("", b.space):  # a user's file: where compile_best finds it
            entry["space_source"] = b.space_source
        old = entries.get(_entry_key(entry))
        if old is not None and old["time_ms"] <= b.time_ms and old.get("study") != b.study:
            continue
        entries[_entry_key(entry)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(entries.values(), key=lambda e: (e["space"], e["problem_key"])), indent=1))
    tmp.replace(path)
    return TunedCache(path, list(entries.values()), cache.set_aside)


def _entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
    return e["space"], e.get("hardware"), e.get("oracle", "gpu"), e["problem_key"]
