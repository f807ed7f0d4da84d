"""Does an item's place in the confirmation's rounds bias its time? The same launch, entered several times.

The confirmation stage (:func:`evotune.measurement.retiming.confirm_rounds`) times its items in rounds, each
round taking ``per_round`` samples of every item in turn. Here every item is the same launch, each copy with its
own CUDA graph, timed by ``evotune.autotune``'s oracle timer (clean L2 before each sample), so any difference
between the copies' confirmed medians comes from the order alone:

* ``--shapes``: a bf16 ``torch.matmul`` of each shape (M x N x K), 18 µs to 1 ms on an H100;
* ``--moe``: the package's fused-MoE kernel (``search_spaces/_triton_fused_moe.py``) at each batch size of
  Mixtral-8x7B's experts at tensor parallelism 2, with vLLM's H200 configuration for large batches (128 x 256 x 64
  tiles, groups of 16, 8 warps, 4 stages): compute-bound from M = 2048, it holds an H200 at its power cap.

Each workload is confirmed in both orders, ``fixed`` (every round A B C D) and ``rotated`` (each round opens with
the next item: the stage's default), ``--repeats`` times. Printed per workload and order: each copy's median over
the fastest copy's, and ``spread``, the slowest copy over the fastest less one (0: the order costs nothing).

    python3 benchmarks/confirm_order.py --copies 4 --moe 2048,3072,4096 --repeats 2 --out runs/confirm_order.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from evotune.measurement.retiming import confirm_rounds  # noqa: E402
from evotune.triton_tuning.timers import OracleTimer  # noqa: E402

SHAPES = "16x4096x4096,1024x4096x4096,4096x4096x4096,6144x14336x4096"
#: vLLM's configuration for Mixtral-8x7B's experts at tp 2 on an H200 from M = 512 up (its shipped file)
MOE_CONFIG = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16, "num_warps": 8,
              "num_stages": 4}


def matmul_copies(m: int, n: int, k: int, copies: int) -> dict[str, Callable[[], object]]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    return {f"copy{i}": (lambda c=c: torch.matmul(a, b, out=c)) for i, c in enumerate(outs)}


def moe_copies(m: int, copies: int) -> dict[str, Callable[[], object]]:
    from tune_model import moe_calls, moe_plan

    plan = moe_plan("Mixtral-8x7B", 2, str(m))
    return moe_calls(plan, plan.keys[0], {f"copy{i}": MOE_CONFIG for i in range(copies)})


def confirm(calls: dict[str, Callable[[], object]], timer: OracleTimer, rotate: bool) -> dict[str, Any]:
    """The copies confirmed as one stage in the given order: each one's median over the fastest one's."""
    options = replace(timer.confirm_options(len(calls)), rotate=rotate)
    result = confirm_rounds(list(calls), lambda name, n: timer.samples(calls[name], n), options, warm=timer.warm)
    medians = {name: item.median_ms for name, item in result.items.items()}
    fastest = min(medians.values())
    return {"order": "rotated" if rotate else "fixed", "medians_ms": medians,
            "over_fastest": {name: v / fastest for name, v in medians.items()},
            "spread": max(medians.values()) / fastest - 1, "rounds": result.rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--shapes", default=SHAPES, help="matmul shapes MxNxK, comma-separated ('' for none)")
    p.add_argument("--moe", default="", help="fused-MoE batch sizes, comma-separated (default none)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default="runs/confirm_order.json")
    args = p.parse_args()
    workloads: list[tuple[str, Callable[[], dict[str, Callable[[], object]]]]] = []
    for shape in filter(None, args.shapes.split(",")):
        m, n, k = map(int, shape.split("x"))
        workloads.append((f"matmul {shape}", lambda m=m, n=n, k=k: matmul_copies(m, n, k, args.copies)))
    for m in filter(None, args.moe.split(",")):
        workloads.append((f"fused MoE M={int(m)}", lambda m=int(m): moe_copies(m, args.copies)))
    timer = OracleTimer()
    rows = []
    for label, make in workloads:
        calls = make()
        for call in calls.values():  # built and loaded before the stage
            call()
        torch.cuda.synchronize()
        for repeat in range(args.repeats):
            for rotate in (False, True):
                row = {"workload": label, "repeat": repeat, **confirm(calls, timer, rotate)}
                rows.append(row)
                print(f"{label:>26} {row['order']:>7}: "
                      + "  ".join(f"{name} {v:.4f}" for name, v in row["over_fastest"].items())
                      + f"  spread {100 * row['spread']:.2f}% ({min(row['medians_ms'].values()):.4g} ms, "
                      f"{row['rounds']} rounds)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "copies": args.copies,
                                          "moe_config": MOE_CONFIG, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
