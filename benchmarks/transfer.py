"""Leave one out: does ``default`` tune a landscape faster when it learns from the related ones?

Two families of recorded landscapes:

* **h100**: for each landscape of ``evotune/landscapes/h100/``, the other
  landscapes of the same space (other shapes and dtypes, the same GPU) are its sources;
* **kerneltuner**: for each kernel shipped for several GPUs in
  ``evotune/landscapes/kerneltuner/``, each GPU's file in turn is the target and the
  other GPUs' files are its sources.

Each target is replayed with ``default`` with transfer (``default+transfer``), without
(``default``), ``random`` and ``tpe``, seeds ``--seed`` onwards, and (kerneltuner, with
``--kt``) Kernel Tuner's strategies at up to twice the largest budget, in its simulation
mode. **Kernel Tuner's ``tune_cache`` simulation searches only the error-free entries of a
file, while evotune's strategies pay an evaluation for every failing one**, so the kt: rows
are favoured wherever a landscape holds failures.

Printed (and written to ``--out``/RESULTS.md, with ``runs.csv``): per landscape, the median
over seeds of the evaluations to 0.95 and 0.99 of the optimum (budget + 1 when never
reached) and of the fraction of the optimum at each budget; then the acceptance checks.

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/transfer.py --family h100 --repeats 10 --out runs/transfer_h100
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/transfer.py --family kerneltuner --kt --repeats 10 \\
        --out runs/transfer_kt
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.landscape import load_landscape  # noqa: E402
from evotune.reporting.compare import KT_PREFIX, KT_STRATEGIES, Case, KernelTunerSim, budget_dependent  # noqa: E402
from evotune.reporting.compare import geometric_mean as gmean  # noqa: E402
from evotune.reporting.compare.metrics import run_metrics  # noqa: E402
from evotune.reporting.compare.runs import run_evotune  # noqa: E402
from evotune.search.strategies import Source  # noqa: E402
from evotune.search.transfer import device_distance, from_landscape, vendor  # noqa: E402

LANDSCAPES = ROOT / "evotune/landscapes"
FOLDERS = {"h100": LANDSCAPES / "h100", "kerneltuner": LANDSCAPES / "kerneltuner",
           "h100_cutlass": LANDSCAPES / "h100_cutlass", "h100_conv": LANDSCAPES / "h100_conv",
           "adversarial": LANDSCAPES / "kerneltuner"}
BUDGETS = {"h100": (10, 25, 50), "kerneltuner": (25, 50, 100, 200), "h100_cutlass": (10, 25, 50),
           "h100_conv": (10, 25, 50, 100), "adversarial": (25, 50, 100, 200)}
EVOTUNE = ("default+transfer", "default", "random", "tpe")
#: the transfer property: at every budget from FLOOR_BUDGET on, default with sources reaches at least plain
#: default's median fraction less FLOOR_SLACK, and at most FLOOR_EVALS times its median evaluations to 0.99 (or
#: one evaluation more, where a tenth is less than one)
FLOOR_BUDGET, FLOOR_SLACK, FLOOR_EVALS = 50, 0.01, 1.10


def evals_within_floor(with_sources: float, plain: float) -> bool:
    """Whether median evaluations to 0.99 with sources are within the property's bound of plain default's."""
    return with_sources <= max(FLOOR_EVALS * plain, plain + 1)


def groups(family: str) -> dict[str, list[Path]]:
    """Landscapes that transfer to each other: by space (h100) or by kernel (kerneltuner); two at least."""
    out: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(FOLDERS[family].glob("*.json.gz")):
        ls = load_landscape(path)
        out[ls.space_name if family.startswith("h100") else ls.problem.kind].append(path)
    return {k: v for k, v in out.items() if len(v) > 1 or family == "adversarial"}


def sources_for(target: Case, others: list[Case]) -> list[Source]:
    device = target.landscape.meta.get("device")
    return [from_landscape(o.landscape, target.landscape.problem, device) for o in others]


# -- adversarial sources: what a misleading related result can look like -------------------------------------
def _source(target: Case, rows: np.ndarray, times: np.ndarray, name: str, device: str | None) -> Source:
    """A source of the target's space holding ``times`` at the target's feasible ``rows`` (nan: failed)."""
    _, fs, _ = target.replay()
    results = tuple((fs.point(int(r)), None if math.isnan(t) else float(t)) for r, t in zip(rows, times, strict=True))
    return Source(name, results, device_distance(device, target.landscape.meta.get("device")))


def local_optimum_source(target: Case) -> Source:
    """The target's own times, except that every point faster than one of its local optima (the fastest that
    is at most 0.9 of the optimum and no slower than any one-parameter neighbour) is made slower than it: the
    source's best point is that local optimum, and it ranks all the other points as the target does."""
    _, fs, times = target.replay()
    ok = np.flatnonzero(~np.isnan(times))
    codes = fs.codes
    local = None
    for r in ok[np.argsort(times[ok], kind="stable")]:
        if target.optimum / times[r] > 0.9:
            continue
        near = np.flatnonzero((codes != codes[r]).sum(1) == 1)
        near = near[~np.isnan(times[near])]
        if not len(near) or times[near].min() >= times[r]:
            local = int(r)
            break
    if local is None:
        raise ValueError(f"{target.name}: no local optimum below 0.9 of the optimum")
    t_local = float(times[local])
    out = times.copy()
    faster = ~np.isnan(times) & (times < t_local)
    out[faster] = t_local * t_local / times[faster] * 1.01  # faster in the target: slower than it here
    return _source(target, np.arange(len(fs)), out, "adversarial:local-optimum", target.landscape.meta.get("device"))


def reversed_source(target: Case) -> Source:
    """The target's own times with their ranking reversed (the fastest point is the slowest), failures kept."""
    _, fs, times = target.replay()
    return _source(target, np.arange(len(fs)), 1.0 / times, "adversarial:reversed",
                   target.landscape.meta.get("device"))


def other_vendor_source(target: Case) -> Source:
    """The target's times with every ordered parameter's choices shifted by half their number (cyclically),
    as recorded on another vendor's GPU: the ranking of points is the target's, its good region elsewhere."""
    space, fs, times = target.replay()
    codes = fs.codes
    sizes = np.array([len(p.choices) for p in space.params])
    shift = np.array([k // 2 if p.ordered and k > 2 else 0 for p, k in zip(space.params, sizes, strict=True)])
    rows, out = [], []
    for r in range(len(fs)):  # the source's time at r is the target's at r's shifted twin, where that is feasible
        twin = fs.row_of(tuple(int(v) for v in (codes[r] + shift) % sizes))
        if twin is not None:
            rows.append(r)
            out.append(times[twin])
    device = str(target.landscape.meta.get("device") or "")
    other = "NVIDIA RTX A4000" if vendor(device) == "amd" else "AMD Radeon PRO W6600"
    return _source(target, np.array(rows), np.array(out), "adversarial:other-vendor", other)


ADVERSARIAL = {"local-optimum": local_optimum_source, "reversed": reversed_source,
               "other-vendor": other_vendor_source}


def cases(family: str, target: Case, others: list[Case]) -> dict[str, list[Source]]:
    """The sources of each ``default+...`` strategy on ``target``: the other landscapes of its group
    (``default+transfer``), or, for the adversarial family, each misleading source in turn."""
    if family != "adversarial":
        return {"default+transfer": sources_for(target, others)}
    out = {}
    for kind, make in ADVERSARIAL.items():
        try:
            out[f"default+{kind}"] = [make(target)]
        except ValueError as exc:  # a landscape without a local optimum below 0.9 of the optimum
            print(f"# {exc}", file=sys.stderr)
    return out


def run_target(target: Case, sources: dict[str, list[Source]], strategies: list[str], budgets: list[int],
               seeds: list[int], kt: KernelTunerSim | None) -> list[dict[str, Any]]:
    """One row per (strategy, seed, budget) on ``target``."""
    rows = []
    top = max(budgets)
    for strategy in strategies:
        if strategy.startswith("default+") and strategy not in sources:
            continue
        started = time.perf_counter()
        for seed in seeds:
            if strategy.startswith(KT_PREFIX):
                name = strategy.removeprefix(KT_PREFIX)
                kt_budgets = sorted({b for b in budgets} | {2 * b for b in budgets})
                if budget_dependent(strategy):
                    made = {b: kt.run(target.name, target.landscape, name, seed, b) for b in kt_budgets}
                else:
                    one = kt.run(target.name, target.landscape, name, seed, max(kt_budgets))
                    made = dict.fromkeys(kt_budgets, one)
            else:
                one = run_evotune(target, strategy.split("+")[0], seed, top, sources=sources.get(strategy, ()))
                made = dict.fromkeys(budgets, one)
            for b, run in made.items():
                m = run_metrics(run, target, b)
                rows.append({"landscape": target.name, "strategy": strategy, "seed": seed, "budget": b,
                             "fraction": m["fraction"], "evals_to_95": m["evals_to_95"],
                             "evals_to_99": m["evals_to_99"]})
        print(f"# {target.name}: {strategy}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return rows


def med(rows: list[dict[str, Any]], column: str) -> float:
    """The median of ``column`` over ``rows`` (nan for none: a case a landscape does not have)."""
    return float(statistics.median(float(r[column]) for r in rows)) if rows else math.nan


def report(rows: list[dict[str, Any]], family: str, budgets: list[int]) -> str:
    by: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["landscape"], r["strategy"], int(r["budget"]))].append(r)
    names = sorted({r["landscape"] for r in rows})
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    evo = [s for s in strategies if not s.startswith(KT_PREFIX)]
    top = max(budgets)
    lines = [f"Median over seeds; evaluations to a fraction are budget + 1 ({top + 1}) when never reached "
             f"within {top}.", "",
             "| landscape | " + " | ".join(f"{s}: to 0.95 / 0.99" for s in evo) + " | "
             + " | ".join(f"{s} at {'/'.join(map(str, budgets))}" for s in evo[:2]) + " |",
             "|---" * (1 + 2 * len(evo[:2]) + len(evo) - len(evo[:2])) + "|"]
    for n in names:
        cells = [f"{med(by[(n, s, top)], 'evals_to_95'):g} / {med(by[(n, s, top)], 'evals_to_99'):g}" for s in evo]
        cells += [" / ".join(f"{med(by[(n, s, b)], 'fraction'):.3f}" for b in budgets) for s in evo[:2]]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += ["Geometric mean over landscapes of the median fraction of the optimum:", "",
              "| strategy | " + " | ".join(str(b) for b in budgets) + " |", "|---" * (1 + len(budgets)) + "|"]
    kt_budgets = sorted({b for b in budgets} | {2 * b for b in budgets})
    for s in strategies:
        bs = kt_budgets if s.startswith(KT_PREFIX) else budgets
        cells = {b: gmean([med(by[(n, s, b)], "fraction") for n in names]) for b in bs}
        lines.append(f"| {s} | " + " | ".join(f"{cells[b]:.4f}" if b in cells else "-" for b in budgets) + " |"
                     + (" 2B: " + " / ".join(f"{cells[2 * b]:.4f}" for b in budgets) if s.startswith(KT_PREFIX)
                        else ""))
    lines.append("")
    lines += floor_check(by, names, [s for s in evo if s.startswith("default+")], budgets)
    if "default+transfer" in strategies and "default" in strategies:
        e99 = {n: (med(by[(n, "default+transfer", top)], "evals_to_99"), med(by[(n, "default", top)], "evals_to_99"))
               for n in names}
        within10 = [n for n in names if e99[n][0] <= 10]
        worse = [f"{n} ({a:g} > {b:g})" for n, (a, b) in e99.items() if a > b]
        lines += [f"- default+transfer reaches 0.99 within 10 evaluations (median) on {len(within10)} of "
                  f"{len(names)} landscapes ({100 * len(within10) / len(names):.0f}%)",
                  f"- median evaluations to 0.99 worse than without transfer on {len(worse)} of {len(names)}"
                  + (": " + ", ".join(worse) if worse else "")]
    kts = [s for s in strategies if s.startswith(KT_PREFIX)]
    if kts and "default+transfer" in strategies:
        kernels: dict[str, list[str]] = defaultdict(list)
        for n in names:
            kernels[n.rsplit("_", 1)[0].split("_RTX")[0]].append(n)
        lines += ["", "default+transfer at B against the best Kernel Tuner strategy at 2B, per landscape and per "
                  "kernel (gmean over its GPUs) of the median fraction:", "",
                  "| landscape or kernel | " + " | ".join(f"B={b}" for b in budgets) + " |",
                  "|---" * (1 + len(budgets)) + "|"]
        fails = 0
        for label, which in [*[(n, [n]) for n in names], *[(f"**{k}**", v) for k, v in sorted(kernels.items())]]:
            cells = []
            for b in budgets:
                d = gmean([med(by[(n, "default+transfer", b)], "fraction") for n in which])
                k = max(gmean([med(by[(n, s, 2 * b)], "fraction") for n in which]) for s in kts)
                fails += d < k
                cells.append(f"{d:.3f} vs {k:.3f} {'yes' if d >= k else 'NO'}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append(f"\nCells where default+transfer at B is below the best Kernel Tuner strategy at 2B: {fails}")
    return "\n".join(lines) + "\n"


def floor_check(by: dict[tuple[str, str, int], list[dict[str, Any]]], names: list[str], transfer: list[str],
                budgets: list[int]) -> list[str]:
    """The transfer property, per landscape and ``default+...`` strategy, against plain ``default``."""
    if not transfer or not any(by.get((n, "default", max(budgets))) for n in names):
        return []
    top = max(budgets)
    floor = [b for b in budgets if b >= FLOOR_BUDGET]
    lines = [f"The transfer property (median over seeds): at B >= {FLOOR_BUDGET}, the fraction with sources at "
             f"least plain default's - {FLOOR_SLACK}; evaluations to 0.99 at most {FLOOR_EVALS:g}x plain default's "
             "(or one more):",
             "", "| landscape | strategy | " + " | ".join(f"B={b}: with / without" for b in floor)
             + " | to 0.99: with / without | holds |", "|---" * (4 + len(floor)) + "|"]
    fails = []
    for n in names:
        for s in transfer:
            if not by.get((n, s, top)):  # a case this landscape does not have (no local optimum below 0.9)
                continue
            fr = [(med(by[(n, s, b)], "fraction"), med(by[(n, "default", b)], "fraction")) for b in floor]
            e = (med(by[(n, s, top)], "evals_to_99"), med(by[(n, "default", top)], "evals_to_99"))
            ok = all(a >= b - FLOOR_SLACK for a, b in fr) and evals_within_floor(*e)
            fails += [] if ok else [f"{n} {s}"]
            lines.append(f"| {n} | {s} | " + " | ".join(f"{a:.3f} / {b:.3f}" for a, b in fr)
                         + f" | {e[0]:g} / {e[1]:g} | {'yes' if ok else 'NO'} |")
    lines += ["", f"Cases where the property fails: {len(fails)}" + (": " + ", ".join(fails) if fails else ""), ""]
    return lines


def one_target(job: tuple[str, Path, list[Path], list[str], list[int], list[int], bool]) -> list[dict[str, Any]]:
    """The rows of one target landscape (its group's other files being its sources), in a process of its own."""
    family, path, others, strategies, budgets, seeds, with_kt = job
    top = 2 * max(budgets)
    target, rest = Case.load(str(path), top), [Case.load(str(p), top) for p in others]
    with tempfile.TemporaryDirectory(prefix="evotune-transfer-") as tmp:
        kt = KernelTunerSim(Path(tmp)) if with_kt else None
        return run_target(target, cases(family, target, rest), strategies, budgets, seeds, kt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FOLDERS), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategy", action="append", help=f"default: {', '.join(EVOTUNE)}")
    ap.add_argument("--kt", action="store_true", help="also Kernel Tuner's strategies, at up to twice the budget")
    ap.add_argument("--only", action="append", help="only the landscapes whose name contains this")
    ap.add_argument("--jobs", type=int, default=1, help="landscapes run side by side (processes)")
    args = ap.parse_args(argv)
    budgets = list(BUDGETS[args.family])
    default = EVOTUNE if args.family != "adversarial" else ("default", *(f"default+{k}" for k in ADVERSARIAL))
    strategies = list(args.strategy or default) + ([KT_PREFIX + n for n in KT_STRATEGIES] if args.kt else [])
    seeds = [args.seed + r for r in range(args.repeats)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for paths in groups(args.family).values():
        for i, path in enumerate(paths):
            if not args.only or any(o in path.name for o in args.only):
                jobs.append((args.family, path, paths[:i] + paths[i + 1:], strategies, budgets, seeds, args.kt))
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            rows = [r for got in pool.map(one_target, jobs, chunksize=1) for r in got]
    else:
        rows = [r for job in jobs for r in one_target(job)]
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    text = report(rows, args.family, budgets)
    (out / "RESULTS.md").write_text(f"# benchmarks/transfer.py\n\n`{' '.join(sys.argv)}`\n\n{text}")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
