"""Whether a fused-MoE key ranks its configurations the same in short evaluations and over a sustained run.

The search times each configuration once, briefly (the oracle's samples until the median's 95% CI is within 1%:
about 25 ms at Mixtral's M = 4096), between builds; the confirmation and a server run each configuration for
seconds. At compute-bound sizes the two disagreed (one H200: M = 4096's pick 1.395 ms in the search, 1.526 ms in
its confirmation, 1.642 ms re-timed after the grid; below M = 1024 within 1%), and the grid's fastest beat the pick
by 2.3% re-timed. This script times the same configurations both ways, side by side::

    python benchmarks/sustained_ranking.py --model Mixtral-8x7B --tp 2 --m 4096 --grid runs/tm_grid1/grid.json \\
        --run runs/tm_grid1/tune --top 4 --out runs/sustained

The configurations: ``--config`` (JSON, repeatable), the re-timed ones of ``--grid``'s row for ``--m`` (a
``tune_model.py grid`` output: the pick and the grid's three fastest) and the ``--top`` fastest of ``--run``'s study
of that key (a tune-model ``--out``). Each of ``--rounds`` rounds takes them in a fresh order and times each twice:

* **short**: after ``--idle`` seconds with nothing on the GPU, as the search's evaluation does (the oracle's
  adaptive samples);
* **sustained**: after ``--load`` seconds of its own launches back to back, the same samples.

Printed: each configuration's median of each way, its rank in each, Kendall's tau between the two orders, and the
SM clock and power the GPU reported after each way (NVML through torch, where it answers). ``OUT/sustained.json``
holds every round. Under ``TRITON_INTERPRET=1`` it runs on the CPU with the wall clock (the tests).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tune_model import MOE_FIELDS, interpreted, moe_calls, moe_plan, table

from evotune.model.models import ModelError
from evotune.storage.study import open_existing
from evotune.storage.summaries import finished_trials, study_summaries
from evotune.storage.url import StorageError


def grid_configs(path: Path, m: int) -> dict[str, dict[str, int]]:
    """The configurations ``path`` (a grid comparison's grid.json) re-timed at ``m``, by their names there."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"--grid {path}: not a readable grid.json ({type(exc).__name__})") from None
    rows = [r for r in doc.get("retime", []) if isinstance(r, dict) and r.get("M") == m]
    if not rows or "configs" not in rows[0]:
        raise ModelError(f"{path}: retime: no row for M = {m} naming its configurations")
    return {name: {f: int(c[f]) for f in MOE_FIELDS} for name, c in rows[0]["configs"].items()}


def study_configs(run: Path, m: int, top: int) -> dict[str, dict[str, int]]:
    """The ``top`` fastest configurations of ``run``'s fused-MoE study at ``m`` (its autotune.db), as ``search#i``."""
    db = run / "autotune.db"
    if not db.is_file():
        raise ModelError(f"--run {run}: no autotune.db")
    try:  # read only: nothing is created or written in the run's folder
        storage = open_existing(f"sqlite:///{db.resolve()}")
    except StorageError as exc:
        raise ModelError(f"--run {run}: {exc}") from None
    studies = [s.study_name for s in study_summaries(storage)
               if isinstance(key := s.user_attrs.get("key"), dict) and key.get("M") == m and "E" in key]
    if not studies:
        raise ModelError(f"--run {run}: no fused-MoE study of M = {m}")
    timed = [t for t in finished_trials(storage, studies[0]) if t.value is not None]
    fastest = sorted(timed, key=lambda t: t.value)[:top]
    return {f"search#{i + 1}": {f: int(t.params[f]) for f in MOE_FIELDS} for i, t in enumerate(fastest)}


def gpu_state(torch: Any) -> dict[str, float | None]:
    """The SM clock (MHz) and power (W) the GPU reports now; None where it does not answer (no NVML, no GPU)."""
    state: dict[str, float | None] = {"sm_mhz": None, "power_w": None}
    if interpreted() or not torch.cuda.is_available():
        return state
    try:
        state["sm_mhz"] = float(torch.cuda.clock_rate())
        state["power_w"] = float(torch.cuda.power_draw()) / 1000.0
    except Exception:  # no pynvml here: the times alone
        pass
    return state


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two orders of the same items (1: the same order, -1: reversed)."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    if not pairs:
        return 1.0
    agree = sum((a[i] - a[j]) * (b[i] - b[j]) > 0 for i, j in pairs)
    disagree = sum((a[i] - a[j]) * (b[i] - b[j]) < 0 for i, j in pairs)
    return (agree - disagree) / len(pairs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    p.add_argument("--m", type=int, required=True, help="the batch size (tokens) of the key")
    p.add_argument("--config", action="append", default=[], help="a configuration as JSON (repeatable)")
    p.add_argument("--grid", type=Path, help="a grid comparison's grid.json: its re-timed configurations at --m")
    p.add_argument("--run", type=Path, help="a tune-model --out: the --top fastest of its study at --m")
    p.add_argument("--top", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=float, default=0.5, help="seconds the GPU idles before a short timing")
    p.add_argument("--load", type=float, default=1.0, help="seconds of launches before a sustained timing")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        configs: dict[str, dict[str, int]] = {}
        for i, text in enumerate(args.config):
            try:
                given = json.loads(text)
                configs[f"config#{i + 1}"] = {f: int(given[f]) for f in MOE_FIELDS}
            except (ValueError, KeyError, TypeError) as exc:
                raise ModelError(f"--config {text!r}: expected a JSON object with {', '.join(MOE_FIELDS)} "
                                 f"({type(exc).__name__}: {exc})") from None
        if args.grid is not None:
            configs.update(grid_configs(args.grid, args.m))
        if args.run is not None:
            configs.update(study_configs(args.run, args.m, args.top))
        if len(configs) < 2:
            raise ModelError("give at least two configurations (--config, --grid, --run)")
        plan = moe_plan(args.model, args.tp, str(args.m), args.dtype)
    except ModelError as exc:
        print(f"sustained_ranking: error: {exc}", file=sys.stderr)
        return 2
    result = measure(plan, args, configs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sustained.json").write_text(json.dumps(result, indent=1))
    names = list(configs)
    short = [result["median_ms"][n]["short"] for n in names]
    held = [result["median_ms"][n]["sustained"] for n in names]
    rank = {n: (sorted(short).index(s) + 1, sorted(held).index(h) + 1)
            for n, s, h in zip(names, short, held, strict=True)}
    print(table([[n, result["median_ms"][n]["short"], result["median_ms"][n]["sustained"],
                  result["median_ms"][n]["sustained"] / result["median_ms"][n]["short"], *rank[n]] for n in names],
                ["configuration", "short ms", "sustained ms", "ratio", "short rank", "sustained rank"]))
    print(f"M = {args.m}: Kendall's tau between the two orders {result['tau']:.3f}; GPU after short "
          f"{result['state']['short']}, after sustained {result['state']['sustained']}; {args.out / 'sustained.json'}")
    return 0


def measure(plan: Any, args: argparse.Namespace, configs: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Every round's short and sustained medians of each configuration, their medians, tau and the GPU's state."""
    import torch

    from evotune.triton_tuning.timers import OracleTimer, Timer, WallClockTimer

    calls = moe_calls(plan, plan.keys[0], configs)
    timer: Timer = WallClockTimer() if interpreted() else OracleTimer()
    sync = (lambda: None) if interpreted() else torch.cuda.synchronize
    chunk = 1 if interpreted() else 20  # launches between looks at the clock (an interpreted one takes seconds)
    started = time.perf_counter()
    for call in calls.values():  # built and loaded before any timing
        call()
    sync()
    print(f"{len(calls)} configurations built and loaded in {time.perf_counter() - started:.1f} s", flush=True)
    rng = random.Random(args.seed)
    rounds: list[dict[str, dict[str, float]]] = []
    states: dict[str, list[dict[str, float | None]]] = {"short": [], "sustained": []}
    for _ in range(args.rounds):
        order = list(calls)
        rng.shuffle(order)
        got: dict[str, dict[str, float]] = {}
        for name in order:
            time.sleep(args.idle)  # the GPU idles, as between a search's builds
            short, _ = timer.measure(calls[name])
            states["short"].append(gpu_state(torch))
            until = time.perf_counter() + args.load
            while time.perf_counter() < until:  # launches back to back, as a server runs the kernel
                for _ in range(chunk):
                    calls[name]()
                sync()
            held, _ = timer.measure(calls[name])
            states["sustained"].append(gpu_state(torch))
            got[name] = {"short": short, "sustained": held}
        rounds.append(got)
        print(f"round {len(rounds)} of {args.rounds} after {time.perf_counter() - started:.1f} s", flush=True)
    medians = {n: {w: statistics.median(r[n][w] for r in rounds) for w in ("short", "sustained")} for n in calls}
    names = list(calls)
    tau = kendall_tau([medians[n]["short"] for n in names], [medians[n]["sustained"] for n in names])

    def typical(way: str) -> dict[str, float | None]:
        values = {f: [s[f] for s in states[way] if s[f] is not None] for f in ("sm_mhz", "power_w")}
        return {f: (statistics.median(v) if v else None) for f, v in values.items()}

    return {"model": args.model, "tp": args.tp, "dtype": args.dtype, "m": args.m, "idle_s": args.idle,
            "load_s": args.load, "configs": configs, "rounds": rounds, "median_ms": medians, "tau": tau,
            "state": {w: typical(w) for w in ("short", "sustained")},
            "device": "interpreter" if interpreted() else torch.cuda.get_device_name()}


if __name__ == "__main__":
    sys.exit(main())
