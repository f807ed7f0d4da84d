"""Kernel quality on the H100: confirmed ratios against cuBLAS, then the best of each recorded space.

First the confirmed table (``--confirmed``, ``benchmarks/confirmed/h100.json``, written by
``benchmarks/confirmed_table.py`` from GPU runs that ended with the confirmation stage): per
problem the best of all spaces and the baseline re-timed side by side, their ratio, the 95% CI
and, for memory-bound shapes, the % of the read bandwidth measured in the same run; then the
geometric mean per dtype. The chart (``--plot``) draws these confirmed ratios.

Then the landscapes' own figures, **not confirmed**: every figure comes from one landscape file, so
the best configuration and the baseline (torch.matmul for floats, torch._int_mm for int8; for
M <= 16 a zero-padded torch._int_mm, which refuses smaller M) were timed by the same oracle in the
same ``evotune record`` run, the baseline once, before recording. No GPU is needed to run this.

Per shape and dtype it gives the best of the space, the baseline, their ratio
(baseline time / best time: above 1 the space wins), the percentage of the
H100's dense tensor peak and of the HBM roofline (the fewest bytes a GEMM must
move, at the copy bandwidth measured in the same run), and the spread between
the slowest and the fastest feasible configuration. The geometric mean of the
ratios is given per dtype and space, then the best of all spaces per shape (each
space's ratio against its own same-run baseline, the winner's counted). A further
table says, per shape class and for the spaces recorded whole, how
much each knob matters: for each knob, the time lost by the worst choice of
that knob when every other knob is free (the best time over the points with
that value, over the optimum), as a median over the class's shapes.

Usage::

    python benchmarks/kernel_quality.py                      # table to stdout, runs/plots/kernel_quality.png
    python benchmarks/kernel_quality.py --markdown runs/kq.md
    python benchmarks/kernel_quality.py --dir evotune/landscapes/h100   # one folder only
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.hardware import get_hardware  # noqa: E402
from evotune.core.landscape import Landscape, load_landscape  # noqa: E402
from evotune.core.result import Status  # noqa: E402
from evotune.reporting.compare import geometric_mean  # noqa: E402
from evotune.reporting.report import throughput  # noqa: E402

H100_DIRS = [ROOT / "evotune" / "landscapes" / "h100", ROOT / "evotune" / "landscapes" / "h100_cutlass"]
CONFIRMED = ROOT / "benchmarks" / "confirmed" / "h100.json"
CHART_TITLE = "H100: each problem's best of all spaces against cuBLAS, confirmed side by side"
# a shape where the best of all spaces is below this much of the baseline's speed counts as lost, not tied
TIE = 0.97


@dataclass
class Row:
    space: str
    problem: str  # "M x N x K"
    dtype: str
    m: int
    n: int
    k: int
    best_ms: float
    best_config: dict
    baseline: str
    baseline_ms: float | None
    peak_pct: float
    roofline_pct: float | None
    spread: float  # slowest / fastest feasible
    recorded: int
    feasible: int
    failed: int

    @property
    def ratio(self) -> float | None:
        return self.baseline_ms / self.best_ms if self.baseline_ms else None

    @property
    def shape_class(self) -> str:
        if self.n == 65536:
            return "huge N (64 x 65536 x 4096)"
        if self.m == self.n == self.k:
            return "square"
        if self.m == 512 and self.k == 512:
            return "small (TVM: 512 x 16-64 x 512)"
        return "skinny M (16, 64)" if self.m <= 64 else "mid M (256, 1024)"


def row_of(ls: Landscape) -> Row:
    p = ls.problem
    ok = [(r.time_ms, key) for key, r in ls.entries.items() if r.status is Status.OK and r.time_ms]
    best_ms, best_key = min(ok)
    baselines = {name: b for name, b in same_run_baselines(ls, best_ms).items() if b.get("time_ms")}
    name, base = next(iter(baselines.items()), ("none", {}))
    _, peak_pct, roofline = throughput(p, best_ms, get_hardware("H100").peak(p.dtype),
                                       (ls.meta.get("device_info") or {}).get("copy_gbps"))
    return Row(ls.space_name, f"{p.m} x {p.n} x {p.k}", p.dtype, p.m, p.n, p.k, best_ms,
               dict(zip(ls.names, best_key, strict=True)), name, base.get("time_ms"), peak_pct,
               roofline, max(t for t, _ in ok) / best_ms, len(ls), int(ls.meta.get("feasible", len(ls))),
               sum(r.status is not Status.OK for r in ls.entries.values()))


def same_run_baselines(ls: Landscape, best_ms: float) -> dict:
    """The baselines timed in the same run as the optimum.

    A file whose optimum was confirmed holds the baselines re-timed beside it (``confirmation``).
    Otherwise a file recorded in one piece has one set; in several pieces each names its
    fastest new point (``best``), so the optimum's piece is the one whose best it is.
    """
    confirmation = ls.meta.get("confirmation") or {}
    items = confirmation.get("items", {})
    timed = {**confirmation.get("raced_out", {}), **items}  # a raced-out point's time is the stage's too
    if any(math.isclose(timed[k]["median_ms"], best_ms, rel_tol=1e-5) for k in confirmation.get("configs", {})
           if k in timed):
        return {n: {"time_ms": items[n]["median_ms"], "ci95_ms": items[n]["ci95_ms"], "confirmed": True}
                for n in confirmation.get("baselines", []) if n in items}
    pieces = ls.meta.get("pieces") or []
    if len(pieces) <= 1:
        return ls.baselines
    for piece in reversed(pieces):
        best = piece.get("best") or {}
        if best.get("time_ms") is not None and math.isclose(best["time_ms"], best_ms, rel_tol=1e-5):
            return dict(piece.get("baselines") or {})
    raise SystemExit(f"{ls.path}: recorded in {len(pieces)} pieces and none names the optimum as its best, "
                     "so no baseline was timed beside it")


def knob_loss(ls: Landscape) -> dict[str, float]:
    """Per knob: (best time with the knob's worst value, others free) / optimum."""
    ok = [(dict(zip(ls.names, key, strict=True)), r.time_ms) for key, r in ls.entries.items()
          if r.status is Status.OK and r.time_ms]
    opt = min(t for _, t in ok)
    out = {}
    for name in ls.names:
        best_per_value: dict = {}
        for point, t in ok:
            v = point[name]
            best_per_value[v] = min(best_per_value.get(v, math.inf), t)
        out[name] = max(best_per_value.values()) / opt
    return out


def fmt_config(c: dict) -> str:
    return ", ".join(f"{k}={v[0]}x{v[1]}" if isinstance(v, tuple) else f"{k}={v}" for k, v in c.items())


def tables(rows: list[Row], losses: dict[str, list[tuple[str, dict[str, float]]]]) -> str:
    out = ["| space | dtype | M x N x K | best (µs) | baseline (µs) | baseline / best | % of dense peak "
           "| % of HBM roofline | slowest / fastest | points | best configuration |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = f"{r.baseline_ms * 1e3:.1f} ({r.baseline})" if r.baseline_ms else "n/a"
        ratio = f"**{r.ratio:.2f}x**" if r.ratio else "n/a"
        roof = f"{r.roofline_pct:.0f}%" if r.roofline_pct is not None else "n/a"
        points = f"{r.recorded}" if r.recorded >= r.feasible else f"{r.recorded} of {r.feasible} (partial)"
        if r.failed:
            points += f", {r.failed} failed"
        out.append(f"| {r.space} | {r.dtype} | {r.problem} | {r.best_ms * 1e3:.1f} | {base} | {ratio} "
                   f"| {r.peak_pct:.0f}% | {roof} | {r.spread:.1f}x | {points} | {fmt_config(r.best_config)} |")
    out += ["", "Geometric mean of baseline / best (above 1: the space's best beats the baseline):", "",
            "| space | dtype | shapes | geometric mean of baseline / best | of best / baseline (time) | wins |",
            "|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if r.ratio:
            groups.setdefault((r.space, r.dtype), []).append(r)
    for (space, dtype), rs in sorted(groups.items()):
        g = geometric_mean([r.ratio for r in rs])
        wins = sum(r.ratio > 1 for r in rs)
        out.append(f"| {space} | {dtype} | {len(rs)} | **{g:.3f}x** | {1 / g:.3f} | {wins} of {len(rs)} |")
    out += best_of_spaces(rows)
    out += ["", "Time lost by the worst choice of each knob, the others free (median over the class's shapes; "
            "1.00 = the knob does not matter):", ""]
    for space, per_class in losses.items():
        names = list(per_class[0][1])
        out += [f"{space}:", "", "| shape class | shapes | " + " | ".join(names) + " |",
                "|---|---|" + "---|" * len(names)]
        classes: dict[str, list[dict[str, float]]] = {}
        for cls, loss in per_class:
            classes.setdefault(cls, []).append(loss)
        for cls, ls_ in classes.items():
            out.append(f"| {cls} | {len(ls_)} | " + " | ".join(f"{median(x[n] for x in ls_):.2f}" for n in names)
                       + " |")
        out.append("")
    return "\n".join(out)


def best_of_spaces(rows: list[Row]) -> list[str]:
    """Per shape: every space's baseline / best, and the winner; then per dtype the winners' geometric mean."""
    shapes: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if r.ratio:
            shapes.setdefault((r.dtype, r.problem), []).append(r)
    if not any(len(rs) > 1 for rs in shapes.values()):
        return []
    spaces = sorted({r.space for r in rows})
    out = ["", "Best of all spaces per shape (each space's best against its own same-run baseline):", "",
           "| dtype | M x N x K | " + " | ".join(spaces) + " | winner | best of all | its configuration |",
           "|---|---|" + "---|" * len(spaces) + "---|---|---|"]
    winners: dict[str, list[float]] = {}
    for (dtype, problem), rs in shapes.items():
        win = max(rs, key=lambda r: r.ratio)
        by = {r.space: f"{r.ratio:.3f}" for r in rs}
        winners.setdefault(dtype, []).append(win.ratio)
        out.append(f"| {dtype} | {problem} | " + " | ".join(by.get(s, "-") for s in spaces)
                   + f" | {win.space} | **{win.ratio:.3f}x** | {fmt_config(win.best_config)} |")
    out += ["", f"| dtype | shapes | geometric mean, best of all spaces | wins | below {TIE} |",
            "|---|---|---|---|---|"]
    for dtype, ratios in winners.items():
        out.append(f"| {dtype} | {len(ratios)} | **{geometric_mean(ratios):.3f}x** | {sum(x > 1 for x in ratios)} "
                   f"| {sum(x < TIE for x in ratios)} |")
    return out


@dataclass
class Confirmed:
    """A row of the confirmed table (benchmarks/confirmed_table.py writes its fields)."""

    space: str
    dtype: str
    m: int
    n: int
    k: int
    ratio: float  # baseline / best, both confirmed side by side
    time_ms: float
    ci95_ms: list[float]
    baseline: str
    pct_read_bw: float | None

    @classmethod
    def of(cls, d: dict) -> Confirmed:
        return cls(d["space"], d["dtype"], d["m"], d["n"], d["k"], d["speedup"], d["time_ms"], d["ci95_ms"],
                   d["baseline"], d.get("pct_read_bw"))


def load_confirmed(path: Path) -> list[Confirmed]:
    order = {"int8": 0, "bf16": 1, "fp16": 2}
    rows = [Confirmed.of(d) for d in json.loads(path.read_text()) if "m" in d]  # GEMM rows
    return sorted(rows, key=lambda r: (order.get(r.dtype, 9), r.n == 65536, r.m, r.n, r.k))


def confirmed_tables(rows: list[Confirmed], path: Path) -> str:
    out = [f"Confirmed ({path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}): each problem's best of "
           "all spaces and its baseline re-timed side by side:", "",
           "| dtype | M x N x K | space | best (µs) | ±95% | baseline | baseline / best | % of read BW |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        half = 100 * (r.ci95_ms[1] - r.ci95_ms[0]) / 2 / r.time_ms
        bw = f"{r.pct_read_bw:.0f}%" if r.pct_read_bw is not None else "-"
        out.append(f"| {r.dtype} | {r.m} x {r.n} x {r.k} | {r.space} | {r.time_ms * 1e3:.1f} | {half:.1f}% "
                   f"| {r.baseline} | **{r.ratio:.3f}x** | {bw} |")
    out += ["", "| dtype | shapes | geometric mean of baseline / best | lowest | highest | wins |",
            "|---|---|---|---|---|---|"]
    for dtype in dict.fromkeys(r.dtype for r in rows):
        rs = [r for r in rows if r.dtype == dtype]
        lo, hi = min(rs, key=lambda r: r.ratio), max(rs, key=lambda r: r.ratio)
        out.append(f"| {dtype} | {len(rs)} | **{geometric_mean([r.ratio for r in rs]):.3f}x** | {lo.ratio:.3f}x "
                   f"({lo.m} x {lo.n} x {lo.k}) | {hi.ratio:.3f}x ({hi.m} x {hi.n} x {hi.k}) "
                   f"| {sum(r.ratio > 1 for r in rs)} of {len(rs)} |")
    return "\n".join(out)


def confirmed_conv_table(path: Path) -> str:
    """The confirmed table's convolution rows: each layer's best against the fastest baseline re-timed beside it."""
    rows = [d for d in json.loads(path.read_text()) if d.get("kind") == "conv2d"]
    if not rows:
        return ""
    out = ["", "", "Confirmed convolutions (the fastest baseline timed beside each layer's best):", "",
           "| dtype | layer | space | best (µs) | ±95% | baseline | baseline / best |", "|---|---|---|---|---|---|---|"]
    for d in sorted(rows, key=lambda d: d["problem_key"]):
        e, half = d["extra"], 100 * (d["ci95_ms"][1] - d["ci95_ms"][0]) / 2 / d["time_ms"]
        layer = f"N{e['N']} C{e['C']} H{e['H']} W{e['W']} K{e['K']} {e['R']}x{e['S']}"
        out.append(f"| {d['dtype']} | {layer} | {d['space']} | {d['time_ms'] * 1e3:.1f} | {half:.1f}% "
                   f"| {d['baseline']} | **{d['speedup']:.3f}x** |")
    return "\n".join(out)


def bar_chart(rows: Sequence[Row | Confirmed], path: Path, title: str) -> None:
    from evotune.reporting.plots import _save, plt  # matplotlib (Agg) only when plotting

    rows = [r for r in rows if r.ratio]
    fig, ax = plt.subplots(figsize=(max(8, 0.32 * len(rows) + 2), 4.8))
    colors = {"int8": "#1f77b4", "bf16": "#d62728", "fp16": "#2ca02c"}
    xs = range(len(rows))
    ax.bar(xs, [r.ratio for r in rows], color=[colors.get(r.dtype, "grey") for r in rows],
           hatch=None, edgecolor=["none" if r.space == "cute_hopper_gemm" else "black" for r in rows])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(list(xs))
    mark = {"triton_matmul": "T ", "cutlass_sm90_gemm": "C ", "triton_decode_gemm": "D "}
    ax.set_xticklabels([f"{mark.get(r.space, '')}{r.dtype} {r.m}x{r.n}x{r.k}" for r in rows],
                       rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("cuBLAS time / best of space\n(>1: evotune's space wins)")
    ax.set_title(title + " (T = Triton matmul, D = Triton decode GEMM, C = CUTLASS C++ sm90, else CuTe DSL sm90)",
                 fontsize=9)
    for dtype, c in colors.items():
        if any(r.dtype == dtype for r in rows):
            ax.bar([0], [0], color=c, label=dtype)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, action="append", help="folder of recorded landscapes (repeatable; default: "
                    "evotune/landscapes/h100 and h100_cutlass)")
    ap.add_argument("--plot", type=Path, default=Path("runs/plots/kernel_quality.png"),
                    help="where the chart goes (default runs/plots/kernel_quality.png; README's is drawn by "
                         "docs/images/make.py)")
    ap.add_argument("--markdown", type=Path, help="also write the tables here")
    ap.add_argument("--confirmed", type=Path, default=CONFIRMED, help="the confirmed table (benchmarks/"
                    "confirmed_table.py writes it)")
    args = ap.parse_args(argv)
    confirmed = load_confirmed(args.confirmed)
    order = {"int8": 0, "bf16": 1, "fp16": 2}
    loaded = [load_landscape(p) for d in (args.dir or H100_DIRS) for p in sorted(d.glob("*.json.gz"))]
    loaded.sort(key=lambda ls: (ls.space_name != "cute_hopper_gemm", order.get(ls.problem.dtype, 9),
                                ls.problem.n == 65536, ls.problem.m, ls.problem.n, ls.problem.k))
    rows = [row_of(ls) for ls in loaded]
    losses: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for ls, r in zip(loaded, rows, strict=True):
        if ls.meta.get("complete"):  # over a sample, the worst value of a knob says nothing
            losses.setdefault(ls.space_name, []).append((r.shape_class, knob_loss(ls)))
    text = (confirmed_tables(confirmed, args.confirmed) + confirmed_conv_table(args.confirmed)
            + "\n\nNot confirmed: the landscapes' best against a baseline timed once, before recording:\n\n"
            + tables(rows, losses))
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    bar_chart(confirmed, args.plot, CHART_TITLE)
    print(f"\nwrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
