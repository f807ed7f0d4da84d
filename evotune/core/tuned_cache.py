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

:func:`evotune.lookup` and :func:`evotune.compile_best` read it; transfer takes its entries as sources.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ORACLES = ("gpu", "cpu", "replay")


def tuned_path() -> Path:
    return Path(os.environ.get("EVOTUNE_TUNED", Path.home() / ".cache" / "evotune" / "tuned.json"))


def read_tuned(path: Path | None = None) -> list[dict[str, Any]]:
    path = path or tuned_path()
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not a JSON tuning-result cache ({exc})") from exc
    return data if isinstance(data, list) else []


def remember(rows: Iterable[Any], storage: str, path: Path | None = None) -> Path:
    """Merge ``report.Best`` rows into the cache: one entry per (space, hardware, oracle, problem), the fastest
    kept."""
    path = path or tuned_path()
    entries = {_entry_key(e): e for e in read_tuned(path)}
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
    return path


def _entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
    return e["space"], e.get("hardware"), e.get("oracle", "gpu"), e["problem_key"]
