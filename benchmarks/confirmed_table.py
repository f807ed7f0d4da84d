"""The kernel-quality table of confirmed ratios only: ``benchmarks/confirmed/h100.json`` from the runs' storages.

Each row is one problem of a GPU run that ended with the confirmation stage: the fastest confirmed configuration
over every space that tuned it (``python -m evotune best`` picks it the same way), the baseline re-timed beside it
in the same rounds, and their ratio. A problem whose best was not confirmed, or whose confirmation timed no
baseline, is left out and named on stderr: every ratio in the table is a confirmed one.

Fields: ``dtype``, ``m``, ``n``, ``k`` (GEMMs; another kind of problem carries its own fields), ``space``,
``config``, ``flush``, ``time_ms``, ``ci95_ms``, ``baseline``, ``baseline_ms``, ``speedup`` (baseline / best),
``pct_read_bw`` (memory-bound problems: the fewest bytes at the read bandwidth measured in the same run),
``date`` (the confirmation's) and ``command`` (the run's). Rows already in ``--out`` from the same command are
replaced; where another run (another command) has a row for the same problem, the row with the higher confirmed
speed-up stays (each against the baseline timed beside it), so each problem's row is its best of all spaces and
runs::

    python benchmarks/confirmed_table.py --storage sqlite:///runs/h100_confirmed.db --name h100_confirmed \\
        --command "python -m evotune run experiments/h100_confirmed.toml" --out benchmarks/confirmed/h100.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.reporting.report import Best, collect_best  # noqa: E402
from evotune.storage.study import make_storage  # noqa: E402

GEMM_FIELDS = ("dtype", "m", "n", "k")


def problem_fields(problem: dict[str, Any]) -> dict[str, Any]:
    """A GEMM's dtype, m, n, k; any other problem's own fields (its kind included)."""
    if problem.get("kind") == "gemm":
        return {f: problem.get(f) for f in GEMM_FIELDS}
    return dict(problem)


def row(best: Best, date: str | None, command: str) -> dict[str, Any] | None:
    """The table's row of a confirmed best; None when it is not confirmed or has no baseline."""
    if not best.confirmed or not best.baselines:
        return None
    baseline, baseline_ms = min(best.baselines.items(), key=lambda kv: kv[1])  # the fastest baseline timed
    return {**problem_fields(best.problem), "space": best.space, "config": best.config, "flush": best.flush,
            "time_ms": best.time_ms, "ci95_ms": best.ci95_ms, "baseline": baseline, "baseline_ms": baseline_ms,
            "speedup": baseline_ms / best.time_ms, "pct_read_bw": best.pct_read_bw, "date": date,
            "command": command, "problem_key": best.problem_key}


def confirmation_date(storage: optuna.storages.BaseStorage, study: str) -> str | None:
    record = optuna.load_study(study_name=study, storage=storage).user_attrs.get("confirmation") or {}
    return record.get("date")


def table(url: str, name: str | None, command: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, problem keys left out) of one run's storage."""
    storage = make_storage(url)
    rows, left = [], []
    for best in collect_best(storage, name):
        got = row(best, confirmation_date(storage, best.study), command)
        if got is None:
            left.append(best.problem_key)
        else:
            rows.append(got)
    return rows, left


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``new`` in place of ``old``'s rows of the same command; one row per problem, its highest speed-up."""
    commands = {r["command"] for r in new}
    rows = [r for r in old if r.get("command") not in commands] + new
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        kept = best.get(r["problem_key"])
        if kept is None or r["speedup"] > kept["speedup"]:
            best[r["problem_key"]] = r
    return sorted(best.values(), key=lambda r: r["problem_key"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--storage", required=True, help="the run's Optuna storage URL")
    p.add_argument("--name", help="only the studies of this experiment name")
    p.add_argument("--command", required=True, help="the command that made the run, written in every row")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "confirmed" / "h100.json"))
    args = p.parse_args(argv)
    rows, left = table(args.storage, args.name, args.command)
    if not rows:
        print(f"confirmed_table.py: error: --storage: no confirmed problem in {args.storage}"
              + (f" for --name {args.name}" if args.name else ""), file=sys.stderr)
        return 2
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.is_file() else []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merge(old, rows), indent=1) + "\n")
    for key in left:
        print(f"left out (not confirmed, or no baseline): {key}", file=sys.stderr)
    print(f"{out}: {len(rows)} rows from {args.storage}, {len(left)} left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
