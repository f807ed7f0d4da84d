"""How close a decode GEMM can come to the achievable read bandwidth at its own size: a pure read of its bytes.

``best`` reports a memory-bound problem's time as a share of the *achievable read bandwidth*, the rate of a
1 GiB sum after a clean flush. A decode GEMM moves far less (16 MiB for int8 16 x 4096 x 4096), and at that
size the fixed costs of any kernel (launch, the first DRAM round trips, the last wave's tail) are a large
part of its time. This benchmark times kernels that do nothing but read the same number of bytes, with the
oracle that times the GEMMs (CUDA graph, clean L2 flush, CI of the median within 1%):

* ``torch.sum`` of the bytes (as int32 words), the kernel the 1 GiB reference itself runs;
* a grid-stride Triton read (``_read``: each program sums ``UNROLL`` blocks of ``BLOCK`` words per step,
  16-byte vector loads, one partial per program), swept over block size, warps, unrolling and programs
  per SM; the fastest counts.

For each size it prints the fastest read's share of the achievable read bandwidth (the ceiling any kernel
reading those bytes meets, as far as these reads find it) beside the confirmed decode rows of
``benchmarks/confirmed/h100.json`` (their share and the share of the ceiling they reach). Everything goes
to ``--out`` as JSON.

Usage (one GPU; about a minute on an H100)::

    python benchmarks/read_ceiling.py --out runs/read_ceiling.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import itertools
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the decode shapes of the confirmed table: (dtype, M, N, K)
SHAPES = [(dtype, m, n, k) for dtype, ms in (("bf16", (16, 64)), ("int8", (16, 32, 64)))
          for m in ms for n, k in ((4096, 4096), (4096, 11008), (12288, 4096), (22016, 4096))] + \
    [("int8", 64, 65536, 4096)]
# the Triton read's sweep: (BLOCK words, num_warps, UNROLL, programs per SM)
SWEEP = [c for c in itertools.product((1024, 2048, 4096), (4, 8), (1, 4), (1, 2, 4, 8))
         if c[0] * c[2] <= 8192]
WORD = 4  # bytes per int32 word


@functools.cache
def read_kernel() -> Any:
    """The grid-stride read, defined once, on first use (``triton`` imported here so that ``--help`` needs none)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _read(src, out, words, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK * UNROLL
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=tl.int32)
        for base in range(pid * BLOCK * UNROLL, words, step):
            for u in tl.static_range(UNROLL):
                idx = base + u * BLOCK + offs
                acc += tl.load(src + idx, mask=idx < words, other=0)
        tl.store(out + pid, tl.sum(acc, axis=0))

    return _read


def launch_read(src: Any, out: Any, block: int, warps: int, unroll: int, programs: int) -> Any:
    """``fn()`` reading every word of ``src`` (int32) with ``programs`` programs into ``out[:programs]``."""
    kernel = read_kernel()
    words = src.numel()

    def fn() -> None:
        kernel[(programs,)](src, out, words, BLOCK=block, UNROLL=unroll, num_warps=warps)
    return fn


def confirmed_rows(path: Path) -> dict[tuple[str, int, int, int], dict[str, Any]]:
    """The confirmed table's GEMM rows by (dtype, m, n, k)."""
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())
    return {(r["dtype"], r["m"], r["n"], r["k"]): r for r in rows if r.get("m") is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/read_ceiling.json", help="the JSON file to write")
    parser.add_argument("--table", default=str(ROOT / "benchmarks" / "confirmed" / "h100.json"),
                        help="the confirmed table whose decode rows are printed beside the ceilings")
    args = parser.parse_args(argv)
    import torch

    from evotune.core.problem import Problem
    from evotune.measurement.gpu_worker import device_info
    from evotune.measurement.options import TimingOptions
    from evotune.measurement.oracle import Oracle

    oracle = Oracle(TimingOptions(flush="clean"), max_seconds=5.0)
    read_gbps = oracle.read_bandwidth_gbps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sizes = sorted({Problem.gemm(m, n, k, dtype).min_bytes for dtype, m, n, k in SHAPES} | {2**30})
    out = torch.empty(8 * sms, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    ceilings: dict[int, dict[str, Any]] = {}
    for nbytes in sizes:
        src = torch.ones(-(-nbytes // WORD), dtype=torch.int32, device="cuda")
        torch_ms = oracle.time(lambda src=src: torch.sum(src, dim=0, out=sink)).median_ms
        best: tuple[float, tuple[int, ...]] | None = None
        for block, warps, unroll, per_sm in SWEEP:
            fn = launch_read(src, out, block, warps, unroll, per_sm * sms)
            fn()  # compile outside the timing
            ms = oracle.time(fn).median_ms
            if best is None or ms < best[0]:
                best = (ms, (block, warps, unroll, per_sm))
        assert best is not None
        fastest = min(torch_ms, best[0])
        ceilings[nbytes] = {
            "bytes": nbytes, "torch_sum_ms": torch_ms, "triton_read_ms": best[0],
            "triton_read": dict(zip(("BLOCK", "num_warps", "UNROLL", "programs_per_sm"), best[1], strict=True)),
            "pct_read_bw": 100 * nbytes / (read_gbps * 1e9) / (fastest * 1e-3)}

    table = confirmed_rows(Path(args.table))
    shapes = []
    print(f"achievable read bandwidth (1 GiB torch.sum, clean flush): {read_gbps:.0f} GB/s; a 1 GiB Triton read: "
          f"{ceilings[2**30]['pct_read_bw']:.1f}% of it")
    print(f"{'shape':<26}{'MiB':>8}{'read (us)':>11}{'ceiling':>9}{'decode row':>12}{'of ceiling':>12}")
    for dtype, m, n, k in SHAPES:
        nbytes = Problem.gemm(m, n, k, dtype).min_bytes
        c = ceilings[nbytes]
        row = table.get((dtype, m, n, k))
        shape = {"dtype": dtype, "m": m, "n": n, "k": k, **c}
        if row and row.get("pct_read_bw"):
            shape.update(row_space=row["space"], row_time_ms=row["time_ms"], row_pct_read_bw=row["pct_read_bw"],
                         row_date=row["date"], row_of_ceiling=row["pct_read_bw"] / c["pct_read_bw"])
        shapes.append(shape)
        read_us = 1e3 * min(c["torch_sum_ms"], c["triton_read_ms"])
        tail = f"{shape['row_pct_read_bw']:>11.0f}%{100 * shape['row_of_ceiling']:>11.0f}%" if "row_of_ceiling" \
            in shape else f"{'-':>12}{'-':>12}"
        print(f"{f'{dtype} {m}x{n}x{k}':<26}{nbytes / 2**20:>8.1f}{read_us:>11.2f}{c['pct_read_bw']:>8.0f}%{tail}")
    result = {"date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "device_info": device_info(),
              "command": " ".join(["python", "benchmarks/read_ceiling.py", *(argv if argv is not None
                                                                             else sys.argv[1:])]),
              "read_gbps": read_gbps, "ceilings": list(ceilings.values()), "shapes": shapes}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
