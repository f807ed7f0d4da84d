"""Which L2 flush predicts a GEMM's time inside a real decode step: the four linear layers of a LLaMA-7B block.

At M = 16 tokens, the block's linear layers (QKV 12288 x 4096, attention output 4096 x 4096, gate/up
22016 x 4096, down 4096 x 11008; bf16, ``y = x @ W^T`` through cuBLAS) run back to back, as a decode step
runs them. Each layer is timed twice over:

* **in the sequence**: right after its predecessors, i.e. the four layers of a previous block (other
  weights, so the L2 holds what a deployment's L2 holds: the last layer's weights and dirty activations)
  and this block's layers before it. The predecessors are one CUDA graph and the layer another; one
  sample is the CUDA events recorded between the two replays and after the second, so the layer's time
  is its own while everything before it ran as in the step;
* **isolated**, by evotune's oracle (CUDA graph, the median of adaptive samples) after the ``dirty`` flush
  and after the ``clean`` one (``evotune/measurement/oracle.py``).

It prints each layer's figures, the mean absolute relative error of each flush's isolated times against
the in-sequence ones, which flush predicts them better, the whole block timed as one graph after the
previous block (beside the sum of its layers' in-sequence times), and the achievable read bandwidth (a
1 GiB sum after a clean flush) with each layer's share of it. Everything goes to ``--out`` as JSON.

Usage (one GPU; about a minute on an H100)::

    python benchmarks/decode_step.py --out runs/decode_step.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.flush import FLUSHES  # noqa: E402
from evotune.measurement.options import TimingOptions  # noqa: E402
from evotune.measurement.oracle import HEAD_START_CYCLES, summarize  # noqa: E402

M = 16
# (name, N, K) of the linear layers of one LLaMA-7B block, in the order a decode step runs them
LAYERS = [("qkv", 12288, 4096), ("attn_out", 4096, 4096), ("gate_up", 22016, 4096), ("down", 4096, 11008)]
BYTES = 2  # bf16


@dataclass
class LayerTimes:
    name: str
    n: int
    k: int
    in_sequence_ms: float
    in_sequence_ci95_ms: tuple[float, float]
    isolated_ms: dict[str, float]  # flush -> the oracle's median
    isolated_ci95_ms: dict[str, tuple[float, float]]

    def rel_error(self, flush: str) -> float:
        """|isolated - in sequence| / in sequence, for the isolated time after ``flush``."""
        return abs(self.isolated_ms[flush] - self.in_sequence_ms) / self.in_sequence_ms


def min_bytes(n: int, k: int, m: int = M) -> int:
    """What one layer must move at least: x, W and y once each."""
    return (m * k + n * k + m * n) * BYTES


def verdict(layers: list[LayerTimes]) -> dict[str, object]:
    """Each flush's mean absolute relative error over the layers, and the flush with the smaller one."""
    errors = {f: statistics.fmean(layer.rel_error(f) for layer in layers) for f in FLUSHES}
    return {"mean_abs_rel_err": errors, "better": min(errors, key=lambda f: errors[f])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/decode_step.json", help="the JSON file to write")
    parser.add_argument("--samples", type=int, default=200, help="in-sequence samples per layer")
    args = parser.parse_args(argv)
    import torch

    from evotune.measurement.gpu_worker import device_info
    from evotune.measurement.oracle import Oracle

    torch.manual_seed(0)
    x = {name: torch.randn(M, k, device="cuda", dtype=torch.bfloat16) for name, _, k in LAYERS}
    y = {name: torch.empty(M, n, device="cuda", dtype=torch.bfloat16) for name, n, _ in LAYERS}
    # two blocks: the previous one runs before this one, so each layer meets the L2 a real step leaves it
    weights = [{name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for name, n, k in LAYERS}
               for _ in range(2)]

    def linear(block: int, name: str) -> Callable[[], object]:
        w = weights[block][name]
        return lambda: torch.matmul(x[name], w.t(), out=y[name])

    def graph(fns: list[Callable[[], object]]) -> Callable[[], object]:
        side = torch.cuda.Stream()  # cuBLAS picks its kernels and workspace outside the capture, on a side
        side.wait_stream(torch.cuda.current_stream())  # stream as torch recommends (as the oracle does)
        with torch.cuda.stream(side):
            for fn in fns:
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
        return g.replay

    previous = [linear(0, name) for name, _, _ in LAYERS]
    this = [linear(1, name) for name, _, _ in LAYERS]

    def after(before: Callable[[], object], timed: Callable[[], object], n: int) -> list[float]:
        """``n`` samples (ms) of ``timed`` replayed right after ``before``, events between the two."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        torch.cuda._sleep(HEAD_START_CYCLES * n)  # the host queues the batch while the GPU waits
        for s, e in zip(starts, ends, strict=True):
            before()
            s.record()
            timed()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]

    def in_sequence(before: Callable[[], object], timed: Callable[[], object]) -> tuple[float, tuple[float, float]]:
        for _ in range(2):  # the first batch brings the clocks up
            samples = after(before, timed, min(args.samples, 50))
        samples = after(before, timed, args.samples)
        med, ci, _ = summarize(samples)
        return med, ci

    oracles = {f: Oracle(TimingOptions(flush=f), max_seconds=5.0) for f in FLUSHES}
    layers = []
    for i, (name, n, k) in enumerate(LAYERS):
        med, ci = in_sequence(graph(previous + this[:i]), graph([this[i]]))
        iso = {f: oracles[f].time(this[i]) for f in FLUSHES}
        layers.append(LayerTimes(name, n, k, med, ci, {f: t.median_ms for f, t in iso.items()},
                                 {f: t.ci95_ms for f, t in iso.items()}))
    block_ms, block_ci = in_sequence(graph(previous), graph(this))
    read_gbps = oracles["clean"].read_bandwidth_gbps()

    result = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "device_info": device_info(),
        "command": " ".join(["python", "benchmarks/decode_step.py", *(argv if argv is not None else sys.argv[1:])]),
        "m": M, "dtype": "bf16", "read_gbps": read_gbps,
        "layers": [{**asdict(layer), "min_bytes": min_bytes(layer.n, layer.k),
                    "pct_read_bw": {"in_sequence": 100 * min_bytes(layer.n, layer.k) / (read_gbps * 1e9)
                                    / (layer.in_sequence_ms * 1e-3),
                                    **{f: 100 * min_bytes(layer.n, layer.k) / (read_gbps * 1e9) / (ms * 1e-3)
                                       for f, ms in layer.isolated_ms.items()}}} for layer in layers],
        "block_in_sequence_ms": block_ms, "block_in_sequence_ci95_ms": block_ci,
        "sum_of_layers_in_sequence_ms": sum(layer.in_sequence_ms for layer in layers),
        **verdict(layers),
    }
    print(f"{'layer':<10}{'N x K':>14}{'in sequence':>14}" + "".join(f"{f + ' flush':>14}" for f in FLUSHES)
          + "   (µs; isolated: evotune's oracle)")
    for layer in layers:
        print(f"{layer.name:<10}{f'{layer.n}x{layer.k}':>14}{layer.in_sequence_ms * 1e3:>14.2f}"
              + "".join(f"{layer.isolated_ms[f] * 1e3:>9.2f} ({100 * layer.rel_error(f):>3.0f}%)" for f in FLUSHES))
    errors = result["mean_abs_rel_err"]
    assert isinstance(errors, dict)
    print("mean |isolated - in sequence| / in sequence: "
          + ", ".join(f"{f} {100 * e:.1f}%" for f, e in errors.items()) + f"; better: {result['better']}")
    print(f"block as one graph after the previous block: {block_ms * 1e3:.2f} µs; sum of its layers in sequence: "
          f"{result['sum_of_layers_in_sequence_ms'] * 1e3:.2f} µs")
    print(f"achievable read bandwidth (1 GiB sum, clean flush): {read_gbps:.0f} GB/s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
