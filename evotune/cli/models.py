"""``python -m evotune tune-model``: every serving kernel of a model, tuned on every GPU of the host, written as the
files vLLM and SGLang read (see docs/tune_model.md)."""

from __future__ import annotations

import argparse
import sys

from evotune.cli.output import UsageError


def cmd_tune_model(args: argparse.Namespace) -> int:
    from evotune.model.command import TuneModelArgs, tune_model
    from evotune.model.exports import ServerFileError
    from evotune.model.models import ModelError
    from evotune.model.runner import WorkerError

    per_gpu = args.workers_per_gpu
    if not per_gpu.isdigit() or int(per_gpu) < 1:
        raise UsageError(f"--workers-per-gpu: expected an integer >= 1, got {per_gpu!r}")
    try:
        return tune_model(TuneModelArgs(args.model, args.tp, args.dtype, args.batch_sizes, args.gpus, args.storage,
                                        args.out, args.dry_run, not args.no_progress, args.tuner, args.kernels,
                                        int(per_gpu)))
    except ModelError as exc:
        raise UsageError(str(exc)) from None
    except (WorkerError, ServerFileError) as exc:
        print(f"evotune: error: {exc}", file=sys.stderr)
        return 1


def _tp(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from evotune.model.preload import DEFAULT_TUNER

    tm = sub.add_parser(
        "tune-model", help="tune every serving kernel of a model (dense GEMMs, fused MoE, block-fp8) at a tensor "
                           "parallelism, one worker per GPU, and write vLLM's and SGLang's config files",
        description="Tune every serving kernel of a model at a tensor parallelism: the dense linear layers per shard "
                    "(decode GEMMs at M <= 64, GEMMs above; block-fp8 GEMMs for fp8), the fused-MoE GEMMs, at "
                    "vLLM's batch sizes. One worker per GPU on one storage, a claim per key (no key tuned twice, "
                    "across hosts with a PostgreSQL --storage); Ctrl-C or a kill loses nothing: run the same "
                    "command again to go on. Writes OUT/vllm/, OUT/sglang/, OUT/autotune.db (the autotune cache), "
                    "OUT/tuned.json (lookup()), OUT/report.md and OUT/report.json.")
    tm.add_argument("model", metavar="MODEL", help="a Hugging Face config.json (path) or a shipped model: "
                                                   "Llama-3-8B, Llama-3-70B, Mixtral-8x7B, DeepSeek-V3")
    tm.add_argument("--tp", type=_tp, default=1, help="tensor parallelism (default 1)")
    tm.add_argument("--dtype", choices=("bf16", "fp8", "int8"),
                    help="the kernels' dtype (default: fp8 for a block-fp8 checkpoint, else bf16)")
    tm.add_argument("--batch-sizes", default="vllm", metavar="vllm|LIST",
                    help="vllm (1,2,4,...,4096, vLLM's 18) or a comma-separated list")
    tm.add_argument("--gpus", default="all", metavar="all|N", help="workers, one per GPU (default: every visible "
                                                                   "GPU; CPU workers under TRITON_INTERPRET=1)")
    tm.add_argument("--workers-per-gpu", default="1", metavar="N",
                    help="workers on each GPU, taking turns on it: one times while another waits for a build "
                         "(default 1)")
    tm.add_argument("--storage", metavar="URL", help="where the run's record and its claims live (default "
                                                     "sqlite under --out; postgresql://... to share across hosts; "
                                                     "each host keeps its keys' trials in its OUT/autotune.db)")
    tm.add_argument("--kernels", default="all", metavar="all|LIST",
                    help="the kernel families to tune, comma-separated: fused_moe, triton_decode_gemm, "
                         "triton_matmul, triton_block_fp8 (default all)")
    tm.add_argument("--out", metavar="DIR", help="outputs folder (default runs/tune_model/MODEL-tpN-DTYPE)")
    tm.add_argument("--dry-run", action="store_true", help="print the kernels, keys and estimated GPU time "
                                                           "beside the grid's; create nothing")
    tm.add_argument("--no-progress", action="store_true", help="no progress line")
    tm.add_argument("--tuner", default=DEFAULT_TUNER, metavar="MODULE:FUNCTION",
                    help="what tunes one key: FUNCTION(plan, out) returns an object with tune(key) -> Outcome "
                         "(default: evotune.autotune on the GPU)")
    tm.set_defaults(func=cmd_tune_model)
