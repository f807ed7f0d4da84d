"""A stand-in key tuner for ``tune-model`` on the CPU: ``--tuner tests/model_standin.py:make``.

It "times" a fixed list of configurations on a synthetic landscape (a deterministic function of the key and the
configuration) and keeps every evaluation as a line of ``OUT/standin/KEY.jsonl`` the moment it is made, as the
autotune cache keeps a trial: an interrupted key resumes from its lines, and the lines show whether any
configuration of any key was ever evaluated twice (by two workers, or by a run and the run that resumed it).
``STANDIN_SLEEP`` (seconds) makes each evaluation last that long, so a test can kill a run mid-key;
``STANDIN_BUILD`` (seconds) waits that long before each, as for a configuration's build, with the GPU's turn given up
(:func:`evotune.measurement.gpu_turn.away`), and each line then holds the evaluation's start and end (``held``: the
wall clock), so a test can see that workers sharing a GPU never evaluate at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from evotune.measurement import gpu_turn
from evotune.measurement.base import began_evaluating
from evotune.model.outcome import Outcome
from evotune.model.plan import Family, Key, Plan

CONFIGS = [{"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g, "num_warps": w,
            "num_stages": s}
           for bm, bn, bk, g, w, s in [(16, 32, 64, 1, 4, 3), (16, 64, 128, 1, 4, 4), (32, 64, 64, 16, 4, 3),
                                       (64, 64, 128, 16, 8, 4), (64, 128, 128, 32, 8, 3), (128, 128, 64, 1, 8, 2)]]
DEFAULT = CONFIGS[0]


def landscape_ms(key: Key, config: dict[str, int]) -> float:
    digest = hashlib.sha256(json.dumps([key.ident, config], sort_keys=True).encode()).digest()
    return 0.01 * (1 + key.m / 64) * (1 + digest[0] / 255)


def log_path(out: Path, key: Key) -> Path:
    return out / "standin" / (hashlib.sha256(key.ident.encode()).hexdigest()[:16] + ".jsonl")


def evaluations(out: Path) -> list[dict]:
    """Every evaluation any run made, in order."""
    return [json.loads(line) for p in sorted((out / "standin").glob("*.jsonl")) for line in p.read_text().splitlines()
            if line.strip()]


class StandInTuner:
    def __init__(self, plan: Plan, out: Path):
        self.plan, self.out = plan, out

    def tune(self, key: Key) -> Outcome:
        path = log_path(self.out, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        seen = {json.dumps(e["config"], sort_keys=True): e["ms"] for e in map(json.loads, path.read_text().splitlines())
                } if path.exists() else {}
        pause = float(os.environ.get("STANDIN_SLEEP", "0"))
        build = float(os.environ.get("STANDIN_BUILD", "0"))
        started = time.perf_counter()
        new = 0
        for config in CONFIGS:
            ident = json.dumps(config, sort_keys=True)
            if ident in seen:
                continue
            if build:
                with gpu_turn.away():
                    time.sleep(build)
            began_evaluating()  # as evotune's loop notes it: the worker's start-up ends at its first
            held = [time.time()]
            time.sleep(pause)
            held.append(time.time())
            ms = landscape_ms(key, config)
            with path.open("a") as f:  # one whole line per evaluation, flushed before the next starts
                f.write(json.dumps({"key": key.ident, "config": config, "ms": ms, "pid": os.getpid(),
                                    "held": held}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            seen[ident] = ms
            new += 1
        best = min(seen, key=lambda k: seen[k])
        untuned = landscape_ms(key, DEFAULT) if key.shape.family in (Family.FUSED_MOE, Family.BLOCK_FP8) else \
            0.02 * (1 + key.m / 64)
        return Outcome(key.ident, key.shape.name, key.shape.family.value, key.fields(), json.loads(best), len(seen),
                       new, time.perf_counter() - started, seen[best], untuned, "timed", "NVIDIA H100 80GB HBM3",
                       "3.4.0", "standin")


def make(plan: Plan, out: Path) -> StandInTuner:
    return StandInTuner(plan, out)
