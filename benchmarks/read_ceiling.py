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
to ``--out`` as JSON. :func:`fastest_read` is that read of any byte count, timed by any timer: ``layer_step.py``
sets a decode step's GEMMs against it.

With ``--experiment`` it times the bytes of exactly that experiment's problems and prints its acceptance table:
for each problem the read's time, the tuned best's share of it (the read's time over the best's, the same bytes)
and the confirmed ratio (the fastest baseline re-timed beside the best, over the best); then the geometric mean
and the minimum of the confirmed ratios and the smallest share among the problems of ``--min-mib`` or more,
which must reach ``--min-share``. The bests come from the experiment's storage (what ``evotune best`` reads), or
from ``--best`` (the JSON ``evotune best`` writes). ``--sizes`` times given sizes only. ``--ceilings`` reuses the
ceilings of an earlier ``--out`` instead of timing them (no GPU).

Usage (one GPU; about a minute on an H100; an experiment's 24 problems about two)::

    python benchmarks/read_ceiling.py --out runs/read_ceiling.json
    python benchmarks/read_ceiling.py --experiment experiments/fp8_decode_tensor.toml --out runs/ceiling.json
    python benchmarks/read_ceiling.py --experiment experiments/fp8_decode_tensor.toml \\
        --best runs/fp8_decode_tensor_best.json --ceilings runs/ceiling.json --out runs/table.json
    python benchmarks/read_ceiling.py --sizes 112MiB,56MiB --out runs/sizes.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import itertools
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
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
READ_FIELDS = ("BLOCK", "num_warps", "UNROLL", "programs_per_sm")  # a SWEEP entry's fields
WORD = 4  # bytes per int32 word
MIN_MIB = 64  # the problems whose share of the read is held to MIN_SHARE: at least this many MiB
MIN_SHARE = 0.90
UNITS = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


class InputError(ValueError):
    """A bad option or input file; ``str()`` is the one line printed, exit code 2."""


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


@dataclass(frozen=True)
class PlainRead:
    """The fastest plain read of ``bytes``: ``torch.sum``'s time, the fastest Triton read's and its configuration."""

    bytes: int
    torch_sum_ms: float
    triton_read_ms: float
    triton_read: dict[str, int]  # READ_FIELDS of the fastest Triton read

    @property
    def ms(self) -> float:
        """The faster of the two: the time a kernel that only reads these bytes takes."""
        return min(self.torch_sum_ms, self.triton_read_ms)


def fastest_read(nbytes: int, time: Callable[[Callable[[], object]], float], device: str = "cuda",
                 sms: int | None = None) -> PlainRead:
    """The fastest plain read of ``nbytes`` (in whole int32 words) on ``device``: ``torch.sum`` of them and the
    Triton read of each configuration of SWEEP (``programs per SM x sms`` programs; ``sms``: the GPU's SMs when
    not given), each timed by ``time`` (its ms); each Triton read launched once first, so that no compile is timed."""
    import torch

    if sms is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    src = torch.ones(-(-nbytes // WORD), dtype=torch.int32, device=device)
    out = torch.empty(max(c[3] for c in SWEEP) * sms, dtype=torch.int32, device=device)
    sink = torch.empty((), dtype=torch.int64, device=device)
    torch_ms = time(lambda: torch.sum(src, dim=0, out=sink))
    best: tuple[float, tuple[int, ...]] | None = None
    for block, warps, unroll, per_sm in SWEEP:
        fn = launch_read(src, out, block, warps, unroll, per_sm * sms)
        fn()
        ms = time(fn)
        if best is None or ms < best[0]:
            best = (ms, (block, warps, unroll, per_sm))
    assert best is not None
    return PlainRead(nbytes, torch_ms, best[0], dict(zip(READ_FIELDS, best[1], strict=True)))


def parse_sizes(text: str) -> list[int]:
    """``"112MiB,56MiB,1000"``: byte counts (suffixes B, KiB, MiB, GiB; a decimal number before one)."""
    out = []
    for item in text.split(","):
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB)?\s*", item)
        if not found or float(found[1]) * UNITS[found[2] or ""] < WORD:
            raise InputError(f"--sizes: {item.strip()!r} is not a size of {WORD} bytes or more (e.g. 4096, 112MiB, "
                             "1.5GiB)")
        out.append(int(float(found[1]) * UNITS[found[2] or ""]))
    return out


def confirmed_rows(path: Path) -> dict[tuple[str, int, int, int], dict[str, Any]]:
    """The confirmed table's GEMM rows by (dtype, m, n, k)."""
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())
    return {(r["dtype"], r["m"], r["n"], r["k"]): r for r in rows if r.get("m") is not None}


# -- the acceptance table of an experiment -------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    """One problem of the acceptance table."""

    problem: str  # its key
    bytes: int
    read_ms: float  # the fastest plain read of its bytes
    best_ms: float | None = None  # the tuned best (confirmed where the run confirmed it)
    confirmed: bool = False
    baseline: str | None = None  # the fastest baseline timed beside the confirmed best
    ratio: float | None = None  # that baseline's time / the best's: confirmed only

    @property
    def share(self) -> float | None:
        """The best's share of the plain read: the read's time over the best's (the same bytes)."""
        return self.read_ms / self.best_ms if self.best_ms else None

    @property
    def held(self) -> bool:
        """Whether its share is held to MIN_SHARE (its bytes are MIN_MIB or more)."""
        return self.bytes >= MIN_MIB * 2**20


@dataclass(frozen=True)
class Summary:
    problems: int
    with_best: int
    confirmed: int
    geomean_ratio: float | None
    min_ratio: float | None
    held: int  # problems of MIN_MIB or more that have a best
    min_held_share: float | None
    held_passed: int  # of those, at MIN_SHARE or more

    @property
    def passed(self) -> bool:
        return self.held_passed == self.held and self.confirmed == self.problems


def best_rows(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """The rows of ``evotune best`` JSON files by problem key."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            rows = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(f"{path}: --best: no such file") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: --best: not a JSON file `evotune best` wrote ({exc})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "problem_key" in r and "time_ms" in r
                                                 for r in rows):
            raise InputError(f"{path}: --best: not a list of best rows (problem_key, time_ms) as `evotune best` "
                             "writes")
        out.update({r["problem_key"]: r for r in rows})
    return out


def stored_rows(experiment: Any) -> dict[str, dict[str, Any]]:
    """The bests of an experiment's studies, as ``evotune best`` reads them (none when it has no storage yet)."""
    from evotune.reporting.report import collect_best

    url = experiment.storage
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return {}
    return {b.problem_key: b.to_dict() for b in collect_best(url, experiment.name)}


def table_lines(problems: list[Any], ceilings: dict[int, dict[str, Any]],
                rows: dict[str, dict[str, Any]]) -> list[Line]:
    """Each problem's line: its read's time (from ``ceilings``, by its bytes) and its best row, when it has one."""
    out = []
    for problem in problems:
        c = ceilings[problem.min_bytes]
        read_ms = min(c["torch_sum_ms"], c["triton_read_ms"])
        row = rows.get(problem.key)
        if row is None:
            out.append(Line(problem.key, problem.min_bytes, read_ms))
            continue
        baselines = {k: float(v) for k, v in (row.get("baselines") or {}).items()}
        confirmed = bool(row.get("confirmed")) and bool(baselines)
        baseline, ratio = None, None
        if confirmed:
            baseline, base_ms = min(baselines.items(), key=lambda kv: kv[1])
            ratio = base_ms / float(row["time_ms"])
        out.append(Line(problem.key, problem.min_bytes, read_ms, float(row["time_ms"]), confirmed, baseline, ratio))
    return out


def summarize(lines: list[Line]) -> Summary:
    ratios = [ln.ratio for ln in lines if ln.ratio is not None]
    held = [ln.share for ln in lines if ln.held and ln.share is not None]
    return Summary(len(lines), sum(ln.best_ms is not None for ln in lines), len(ratios),
                   math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
                   min(ratios) if ratios else None, len(held), min(held) if held else None,
                   sum(s >= MIN_SHARE for s in held))


def print_table(lines: list[Line], summary: Summary) -> None:
    print(f"{'problem':<40}{'MiB':>8}{'read (us)':>11}{'best (us)':>11}{'of read':>9}{'confirmed':>11}")
    for ln in lines:
        best = f"{1e3 * ln.best_ms:>11.2f}" if ln.best_ms else f"{'-':>11}"
        share = f"{100 * ln.share:>7.0f}%{'*' if ln.held else ' '}" if ln.share else f"{'-':>9}"
        ratio = f"{ln.ratio:>10.3f}x" if ln.ratio is not None else f"{'not confirmed' if ln.best_ms else '-':>11}"
        print(f"{ln.problem:<40}{ln.bytes / 2**20:>8.1f}{1e3 * ln.read_ms:>11.2f}{best}{share}{ratio}")
    ratios = (f"geometric mean {summary.geomean_ratio:.3f}x, min {summary.min_ratio:.3f}x"
              if summary.geomean_ratio is not None else "none")
    print(f"confirmed ratios (baseline / best), {summary.confirmed} of {summary.problems} problems: {ratios}")
    held = f"{100 * summary.min_held_share:.0f}%" if summary.min_held_share is not None else "-"
    print(f"* {MIN_MIB} MiB or more: {summary.held_passed} of {summary.held} at {100 * MIN_SHARE:.0f}% of the read "
          f"or more (smallest {held})")
    print(f"every problem confirmed and every shape of {MIN_MIB} MiB or more at {100 * MIN_SHARE:.0f}% of its read: "
          + ("met" if summary.passed else "NOT met"))


def load_ceilings(path: Path) -> dict[int, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
        return {int(c["bytes"]): c for c in data["ceilings"]}
    except FileNotFoundError:
        raise InputError(f"{path}: --ceilings: no such file") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: --ceilings: not a file this benchmark wrote ({exc!r})") from None


def measure(sizes: list[int]) -> tuple[float, dict[int, dict[str, Any]]]:
    """The achievable read bandwidth (GB/s) and each size's fastest read (one GPU)."""
    from evotune.measurement.options import TimingOptions
    from evotune.measurement.oracle import Oracle

    oracle = Oracle(TimingOptions(flush="clean"), max_seconds=5.0)
    read_gbps = oracle.read_bandwidth_gbps()
    ceilings: dict[int, dict[str, Any]] = {}
    for nbytes in sorted(set(sizes)):
        read = fastest_read(nbytes, lambda fn: oracle.time(fn).median_ms)
        ceilings[nbytes] = {**asdict(read), "pct_read_bw": 100 * nbytes / (read_gbps * 1e9) / (read.ms * 1e-3)}
    return read_gbps, ceilings


def decode_rows(ceilings: dict[int, dict[str, Any]], table_path: Path) -> list[dict[str, Any]]:
    """The confirmed table's decode shapes beside their sizes' ceilings, printed."""
    from evotune.core.problem import Problem

    table = confirmed_rows(table_path)
    shapes = []
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
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/read_ceiling.json", help="the JSON file to write")
    parser.add_argument("--table", default=str(ROOT / "benchmarks" / "confirmed" / "h100.json"),
                        help="the confirmed table whose decode rows are printed beside the ceilings (without "
                             "--experiment or --sizes)")
    parser.add_argument("--experiment", action="append", default=[], metavar="TOML",
                        help="time the bytes of this experiment's problems and print its acceptance table "
                             "(repeatable: one table over all)")
    parser.add_argument("--best", action="append", default=[], metavar="JSON",
                        help="the bests from this `evotune best` JSON (repeatable) instead of the experiments' "
                             "storages")
    parser.add_argument("--sizes", help="time these sizes only, e.g. 112MiB,56MiB,4096 (no table)")
    parser.add_argument("--ceilings", metavar="JSON", help="the ceilings of an earlier --out instead of timing "
                                                           "them: no GPU")
    args = parser.parse_args(argv)
    try:
        return run(args, argv)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    from evotune.core.problem import Problem
    from evotune.running.experiment import ExperimentError, load_experiment

    if args.best and not args.experiment:
        raise InputError("--best: give --experiment too (the problems of its table)")
    if args.sizes and args.experiment:
        raise InputError("--sizes: times given sizes only; leave out --experiment, or --sizes")
    out_path = Path(args.out)
    if out_path.is_dir():
        raise InputError(f"{out_path}: --out: a folder, not a file")
    experiments = []
    for path in args.experiment:
        try:
            experiments.append(load_experiment(path))
        except ExperimentError as exc:
            raise InputError(str(exc)) from None
    problems = [p for exp in experiments for p in exp.problems if p.min_bytes is not None]
    if experiments and not problems:
        raise InputError(f"{args.experiment[0]}: problem: no problem with a byte count to time")
    rows = best_rows([Path(b) for b in args.best]) if args.best else \
        {k: r for exp in experiments for k, r in stored_rows(exp).items()}
    if args.sizes:
        sizes = parse_sizes(args.sizes)
    elif problems:
        sizes = [p.min_bytes for p in problems]
    else:
        sizes = [Problem.gemm(m, n, k, dtype).min_bytes for dtype, m, n, k in SHAPES]
    sizes = sorted(set(sizes) | {2**30})
    if args.ceilings:
        ceilings = load_ceilings(Path(args.ceilings))
        missing = [s for s in sizes if s not in ceilings]
        if missing:
            raise InputError(f"{args.ceilings}: --ceilings: no ceiling for {len(missing)} of the sizes "
                             f"(e.g. {missing[0]} bytes): time them without --ceilings")
        read_gbps = float(json.loads(Path(args.ceilings).read_text())["read_gbps"])
        device = json.loads(Path(args.ceilings).read_text()).get("device_info")
    else:
        from evotune.measurement.gpu_worker import device_info

        read_gbps, ceilings = measure(sizes)
        device = device_info()
    print(f"achievable read bandwidth (1 GiB torch.sum, clean flush): {read_gbps:.0f} GB/s; a 1 GiB Triton read: "
          f"{ceilings[2**30]['pct_read_bw']:.1f}% of it")
    result: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "device_info": device,
        "command": " ".join(["python", "benchmarks/read_ceiling.py", *(argv if argv is not None else sys.argv[1:])]),
        "read_gbps": read_gbps, "ceilings": [ceilings[s] for s in sizes]}
    if problems:
        lines = table_lines(problems, ceilings, rows)
        summary = summarize(lines)
        print_table(lines, summary)
        result.update(problems=[{**asdict(ln), "share": ln.share, "held": ln.held} for ln in lines],
                      summary={**asdict(summary), "passed": summary.passed, "min_mib": MIN_MIB,
                               "min_share": MIN_SHARE})
    elif args.sizes:
        print(f"{'MiB':>10}{'read (us)':>11}{'ceiling':>9}")
        for s in sizes:
            c = ceilings[s]
            print(f"{s / 2**20:>10.1f}{1e3 * min(c['torch_sum_ms'], c['triton_read_ms']):>11.2f}"
                  f"{c['pct_read_bw']:>8.0f}%")
    else:
        result["shapes"] = decode_rows(ceilings, Path(args.table))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
