"""The commands of ``evotune.autotune``: ``tune-kernel`` (fill the cache ahead of time) and ``export-configs``."""

from __future__ import annotations

import argparse

from evotune.cli.output import UsageError, make_console


def cmd_tune_kernel(args: argparse.Namespace) -> int:
    from evotune.triton_tuning.commands import CommandError, tune_kernel_command

    try:
        return tune_kernel_command(args.kernel, args.keys, args.cache, make_console(),
                                   None if args.no_progress else make_console(stderr=True), args.space, args.key)
    except CommandError as exc:
        raise UsageError(str(exc)) from None


def cmd_export_configs(args: argparse.Namespace) -> int:
    from evotune.triton_tuning.commands import CommandError, export_command

    try:
        return export_command(args.cache, args.kernel, args.format, args.out, args.batch_key, args.experts_key,
                              args.n_key, args.n_divisor, args.k_key, args.block_shape, args.check)
    except CommandError as exc:
        raise UsageError(str(exc)) from None


def add_kernel_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The two subcommands, on the command line's parser."""
    tk = sub.add_parser("tune-kernel", help="tune a kernel (decorated with evotune.autotune, or a plain jit kernel "
                                            "with --space and --key) for the keys of a file")
    tk.add_argument("kernel", metavar="MODULE:KERNEL", help="a module (dotted name or .py path) and the kernel in it")
    tk.add_argument("--keys", metavar="KEYS.toml", help="the keys to tune and the module's function that builds "
                                                         "each key's launch (see evotune/triton_tuning/ahead.py)")
    tk.add_argument("--cache", metavar="URL_OR_DIR", help="where decisions are kept (default: the decorator's "
                                                           "cache, else $EVOTUNE_AUTOTUNE_CACHE, else "
                                                           "~/.cache/evotune/autotune)")
    tk.add_argument("--no-progress", action="store_true", help="no line per key as it starts and is decided")
    tk.add_argument("--space", metavar="FILE:NAME", help="a plain jit kernel's candidates: a SearchSpace or a list of "
                                                         "triton.Config in a module or .py file")
    tk.add_argument("--key", metavar="NAMES", help="a plain jit kernel's arguments that key a decision, "
                                                   "comma-separated (triton.autotune's key)")
    tk.set_defaults(func=cmd_tune_kernel)

    ex = sub.add_parser("export-configs", help="write evotune.autotune's decisions as JSON or vLLM's fused-MoE or "
                                               "block-fp8 config files, or check such files")
    ex.add_argument("--cache", metavar="URL_OR_DIR", help="the cache to read (default: $EVOTUNE_AUTOTUNE_CACHE, "
                                                           "else ~/.cache/evotune/autotune)")
    ex.add_argument("--kernel", metavar="NAME", help="only this kernel's decisions")
    ex.add_argument("--format", choices=("json", "vllm-moe", "vllm-block-fp8"), default="json")
    ex.add_argument("--out", metavar="PATH", help="json: the file (default runs/autotune_configs.json); vllm-moe, "
                                                  "vllm-block-fp8: the folder (default runs/vllm_configs)")
    ex.add_argument("--batch-key", default="M", help="vllm-*: the key field holding the batch size (default M)")
    ex.add_argument("--experts-key", default="E", help="vllm-moe: the key field holding E (default E)")
    ex.add_argument("--n-key", default="N", help="vllm-*: the key field holding N (default N)")
    ex.add_argument("--k-key", default="K", help="vllm-block-fp8: the key field holding K (default K)")
    ex.add_argument("--n-divisor", default="1", help="vllm-moe: the file's N is the key's over this (2 for a "
                                                     "kernel keyed by the gate-and-up GEMM's N)")
    ex.add_argument("--block-shape", metavar="N,K", help="the weights' scale block the file names: vllm-moe, "
                                                         "block-quantized fp8 (none by default); vllm-block-fp8 "
                                                         "(default 128,128)")
    ex.add_argument("--check", metavar="DIR", help="read every vLLM config file of DIR back and check its name and "
                                                   "contents (nothing is exported)")
    ex.set_defaults(func=cmd_export_configs)
