"""Does an item's place in the confirmation's rounds bias its time? The same launch, entered several times.

The confirmation stage (:func:`evotune.measurement.retiming.confirm_rounds`) times its items in rounds, each
round taking ``per_round`` samples of every item in turn. Here every item is the same launch (a bf16
``torch.matmul`` of one shape, each copy with its own CUDA graph, timed by ``evotune.autotune``'s oracle timer:
clean L2 before each sample), so any difference between the copies' confirmed medians comes from the order
alone. Per shape it prints each copy's median over the first copy's; the items are entered in the same order
every round, as the stage does by default.

    python3 benchmarks/confirm_order.py --copies 4 --out runs/confirm_order.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evotune.triton_tuning.timers import OracleTimer  # noqa: E402

SHAPES = ((16, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096), (6144, 14336, 4096))


def run(m: int, n: int, k: int, copies: int) -> dict:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    calls = {f"copy{i}": (lambda c=c: torch.matmul(a, b, out=c)) for i, c in enumerate(outs)}
    timer = OracleTimer()
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    result = timer.confirm(calls)
    medians = {name: item.median_ms for name, item in result.items.items()}
    first = medians["copy0"]
    return {"shape": f"{m}x{n}x{k}", "medians_ms": medians, "over_first": {k_: v / first for k_, v in medians.items()},
            "rounds": result.rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--out", default="runs/confirm_order.json")
    args = p.parse_args()
    rows = [run(m, n, k, args.copies) for m, n, k in SHAPES]
    for r in rows:
        print(f"{r['shape']:>18}: " + "  ".join(f"{name} {v:.4f}" for name, v in r["over_first"].items())
              + f"  ({r['medians_ms']['copy0']:.4g} ms, {r['rounds']} rounds)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
