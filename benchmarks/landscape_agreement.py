"""How far two recordings of the same landscape agree: is a recorded landscape reproducible?

For the points both files measured correctly it gives the Spearman rank
correlation of their times, the spread of the per-point ratio (second / first:
median, 5th and 95th percentile), and where each file's optimum ranks in the
other; for files recorded with the confirmation stage, the two confirmed optima
side by side. A landscape whose ranking reproduces but whose optimum does not says the
optimum was a lucky (or unlucky) measurement: re-measure the top of it
(``benchmarks/recheck_optima.py``) before quoting it. CPU only.

Usage::

    python benchmarks/landscape_agreement.py FIRST.json.gz SECOND.json.gz [FIRST2 SECOND2 ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.landscape import Landscape, load_landscape  # noqa: E402
from evotune.core.result import Status  # noqa: E402


def _ranks(x: np.ndarray) -> np.ndarray:
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
    return r


def agreement(a: Landscape, b: Landscape) -> dict:
    keys = [k for k, r in a.entries.items()
            if r.status is Status.OK and k in b.entries and b.entries[k].status is Status.OK]
    if len(keys) < 2:
        raise SystemExit(f"{a.path} and {b.path} share fewer than two correctly measured points")
    x = np.array([a.entries[k].time_ms for k in keys])
    y = np.array([b.entries[k].time_ms for k in keys])
    ratio = y / x
    ia, ib = int(np.argmin(x)), int(np.argmin(y))
    return {
        "points": len(keys),
        "spearman": float(np.corrcoef(_ranks(x), _ranks(y))[0, 1]),
        "ratio_median": float(np.median(ratio)),
        "ratio_p5": float(np.percentile(ratio, 5)),
        "ratio_p95": float(np.percentile(ratio, 95)),
        "first_optimum_ms": float(x[ia]), "its_time_in_second_ms": float(y[ia]),
        "its_rank_in_second": int(_ranks(y)[ia]),
        "second_optimum_ms": float(y[ib]), "its_time_in_first_ms": float(x[ib]),
        "its_rank_in_first": int(_ranks(x)[ib]),
    }


def confirmed_optimum(ls: Landscape) -> tuple[float, dict] | None:
    """(median ms, parameters) of the fastest point of the file's confirmation stage; None without one."""
    conf = ls.meta.get("confirmation") or {}
    configs = conf.get("configs", {})
    timed = [(item["median_ms"], configs[key]) for key, item in conf.get("items", {}).items()
             if key in configs and item.get("median_ms") is not None]
    return min(timed, key=lambda t: t[0]) if timed else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="pairs of landscape files: first, second, ...")
    args = ap.parse_args(argv)
    if len(args.files) % 2:
        ap.error("give the files in pairs")
    print("| landscape | points | Spearman | second / first: median (p5-p95) | first's optimum: µs, "
          "then in second (rank) | second's optimum: µs, then in first (rank) |")
    print("|---|---|---|---|---|---|")
    for first, second in zip(args.files[::2], args.files[1::2], strict=True):
        a, b = load_landscape(first), load_landscape(second)
        g = agreement(a, b)
        print(f"| {a.stem} | {g['points']} | {g['spearman']:.3f} | {g['ratio_median']:.3f} "
              f"({g['ratio_p5']:.3f}-{g['ratio_p95']:.3f}) | {g['first_optimum_ms'] * 1e3:.1f}, "
              f"{g['its_time_in_second_ms'] * 1e3:.1f} ({g['its_rank_in_second']}) | "
              f"{g['second_optimum_ms'] * 1e3:.1f}, {g['its_time_in_first_ms'] * 1e3:.1f} "
              f"({g['its_rank_in_first']}) |")
    pairs = [(load_landscape(f), load_landscape(s)) for f, s in zip(args.files[::2], args.files[1::2], strict=True)]
    confirmed = [(a, b, confirmed_optimum(a), confirmed_optimum(b)) for a, b in pairs]
    if any(ca and cb for _, _, ca, cb in confirmed):
        print("\n| landscape | first's confirmed optimum (µs) | second's (µs) | second / first | same configuration |")
        print("|---|---|---|---|---|")
        for a, _, ca, cb in confirmed:
            if ca and cb:
                print(f"| {a.stem} | {ca[0] * 1e3:.2f} | {cb[0] * 1e3:.2f} | {cb[0] / ca[0]:.4f} | "
                      f"{'yes' if ca[1] == cb[1] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
