"""int8 conv2d on the H100: evotune's tuned CUTLASS kernel against the hand-picked configuration and cuDNN.

Reads the storage of a GPU run of ``experiments/h100_int8_conv.toml`` (CUTLASS 2.x,
NC/32HW32) or ``experiments/h100_int8_conv_sm90.toml`` (CUTLASS 3.x sm90, NHWC).
Every figure comes from the run's confirmation stage where it has one: the best
configurations of the search and the baselines (the CUTLASS 2.x hand-picked
128x128x64 / 4-stage configuration, for the sm90 run in both layouts, cuDNN
fp16 through torch on the same shape, cuDNN int8 through the cuDNN frontend)
re-timed side by side, interleaved, in one process; without one, the search's
time and the baselines timed before the search in the same process. A ratio is
the baseline's time over evotune's: above 1 evotune is faster. % of int8 peak
is against the H100's dense int8 tensor peak (WGMMA); % of the HBM roofline is
the fewest bytes the convolution must move at the copy bandwidth measured in
the same run. The geometric means are over the ResNet-50 layers (every problem
but the first).

Usage::

    python -m evotune run experiments/h100_int8_conv.toml          # on the H100
    python benchmarks/conv_int8.py runs/h100_int8_conv.db           # anywhere: a markdown table
    python benchmarks/conv_int8.py runs/h100_int8_conv_sm90.db --experiment experiments/h100_int8_conv_sm90.toml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.problem import Problem  # noqa: E402
from evotune.reporting.compare import geometric_mean  # noqa: E402
from evotune.reporting.report import collect_best  # noqa: E402
from evotune.running.experiment import load_experiment  # noqa: E402
from search_spaces._cutlass_sm90_conv import HAND_PICKED_LABEL  # noqa: E402
from search_spaces.cutlass_conv2d_int8 import HAND_PICKED_NAME  # noqa: E402

CUDNN = {"cudnn fp16 conv2d (torch, channels_last)": "cuDNN fp16", "cudnn int8 conv2d (frontend graph)": "cuDNN int8"}
HAND = HAND_PICKED_LABEL
BASELINES = {  # by space: the baselines' labels in the run, and their columns
    "cutlass_conv2d_int8": {f"cutlass_conv2d_int8: {HAND_PICKED_NAME}": "hand-picked", **CUDNN},
    "cutlass_sm90_conv2d_int8": {f"{HAND} (nc32hw32)": "hand-picked (nc32hw32)",
                                 f"{HAND} (nhwc)": "hand-picked (nhwc)", **CUDNN},
}


def config_text(c: dict) -> str:
    if "tile_m" in c:  # sm90
        stages = c["stages"] or "auto"
        return (f"{c['tile_m']}x{c['tile_n']}x{c['tile_k']}, cluster {c['cluster']}, {stages} st, "
                f"{c['epilogue']} epilogue")
    inst = c["instruction"] if isinstance(c["instruction"], str) else "x".join(map(str, c["instruction"]))
    return (f"{c['tb_m']}x{c['tb_n']}x{c['tb_k']}, warp {c['warp_m']}x{c['warp_n']}, {inst}, {c['stages']} st, "
            f"{c['iterator']}, swz {c['swizzle']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("storage", nargs="?", default="runs/h100_int8_conv.db")
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "h100_int8_conv.toml"))
    args = ap.parse_args()
    exp = load_experiment(args.experiment)
    rows = {b.problem_key: b for b in collect_best(f"sqlite:///{args.storage}", exp.name)}
    baselines = BASELINES[exp.spaces[0]]
    head = ["layer", "evotune (µs)", *(f"vs {v}" for v in baselines.values()), "% int8 peak", "% HBM roofline",
            "configuration"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    ratios: dict[str, list[float]] = {name: [] for name in baselines}
    for i, problem in enumerate(exp.problems):
        b = rows.get(problem.key)
        if b is None:
            print(f"| {problem.describe()} | not run |")
            continue
        layer = Problem.from_dict(b.problem).describe().replace("conv2d ", "")
        layer = layer.replace(f" int8 {problem.layout} tensor scale", "")
        cells = [layer, f"{b.time_ms * 1e3:.1f}" + (" (confirmed)" if b.confirmed else "")]
        for name in baselines:
            t = b.baselines.get(name)
            cells.append(f"{t / b.time_ms:.2f}x ({t * 1e3:.1f})" if t else "-")
            if t and i > 0:
                ratios[name].append(t / b.time_ms)
        cells += [f"{b.pct_peak:.0f}%" if b.pct_peak else "-",
                  f"{b.pct_hbm_roofline:.0f}%" if b.pct_hbm_roofline else "-", config_text(b.config)]
        print("| " + " | ".join(cells) + " |")
    means = [f"{geometric_mean(v):.2f}x" if v else "-" for v in ratios.values()]
    print(f"| geometric mean, ResNet-50 layers | | {' | '.join(means)} | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
