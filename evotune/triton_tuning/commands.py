"""The bodies of ``python -m evotune tune-kernel`` and ``export-configs``; ``cli.py`` shows a
:class:`CommandError` as its one line, exit code 2."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from evotune.storage.study import open_existing
from evotune.storage.url import StorageError, shown, sqlite_file, with_driver
from evotune.triton_tuning.ahead import KeyProgress, Stage, tune_kernel
from evotune.triton_tuning.cache import cache_url
from evotune.triton_tuning.export import (
    ExportError,
    check_vllm_folder,
    entries,
    write_json,
    write_vllm_block_fp8,
    write_vllm_moe,
)
from evotune.triton_tuning.references import AheadError

# where export-configs writes without --out: under runs/, beside the other commands' outputs, never among the files
# of the folder it is run in
EXPORT_JSON = Path("runs/autotune_configs.json")
EXPORT_VLLM_DIR = Path("runs/vllm_configs")


class CommandError(ValueError):
    """A bad argument or input file, in one line naming it and the field."""


FILLED_BY = ("it is filled by python -m evotune tune-kernel, or by running a program whose kernels use "
             "evotune.autotune")


def tune_kernel_command(kernel: str, keys: str | None, cache: str | None, console: Console,
                        progress: Console | None = None, space: str | None = None,
                        key_names: str | None = None) -> int:
    """Tune the keys, saying on ``progress`` (a line as each key starts and one as it is decided) what it does:
    a key can take minutes, and the table comes at the end."""
    if not keys:
        raise CommandError("--keys KEYS.toml is required (the keys to tune)")
    try:
        results = tune_kernel(kernel, Path(keys), cache, space, key_names, None if progress is None else
                              lambda event: progress.print(progress_line(event), markup=False, highlight=False))
    except AheadError as exc:
        raise CommandError(str(exc)) from None
    table = Table(title=f"Tuned: {kernel}")
    for col in ("key", "configuration", "time (ms)", "how"):
        table.add_column(col, overflow="fold")
    for key, config, decision in results:
        table.add_row(",".join(f"{k}={v}" for k, v in key.items()),
                      " ".join(f"{k}={v}" for k, v in config.all_kwargs().items()),
                      "-" if decision is None or decision.time_ms is None else f"{decision.time_ms:.4g}",
                      "single config" if decision is None else decision.how)
    console.print(table)
    return 0


def progress_line(event: KeyProgress) -> str:
    """``key 1/3 (M=512, N=512, K=512): tuning`` as a key starts; its evaluations, best time, how it was decided and
    its seconds once it is decided."""
    head = f"key {event.index + 1}/{event.total} ({', '.join(f'{k}={v}' for k, v in event.entry.items())})"
    if event.stage is Stage.STARTED:
        return f"{head}: tuning"
    d = event.decision
    if d is None:
        return f"{head}: a single configuration, nothing to time ({event.seconds:.1f} s)"
    best = "no time" if d.time_ms is None else f"best {d.time_ms:.4g} ms"
    return (f"{head}: {event.evaluations} evaluations ({event.new} new), {best}, {d.how}, "
            f"{event.seconds:.1f} s")


def _block_shape(text: str | None) -> tuple[int, int] | None:
    """``--block-shape N,K`` as two positive integers (None when not given)."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise CommandError(f"--block-shape: expected two positive integers N,K (as 128,128), got {text!r}")
    return int(parts[0]), int(parts[1])


def export_command(cache: str | None, kernel: str | None, fmt: str, out: str | None, batch: str, experts: str,
                   n: str, n_divisor: str = "1", k: str = "K", block_shape: str | None = None,
                   check: str | None = None) -> int:
    if check is not None:  # read vLLM config files back, nothing to export
        try:
            for checked in check_vllm_folder(Path(check)):
                print(f"{checked}: ok")
        except ExportError as exc:
            raise CommandError(str(exc)) from None
        return 0
    try:
        divisor = int(n_divisor)
    except ValueError:
        divisor = 0
    if divisor < 1:
        raise CommandError(f"--n-divisor: expected an integer >= 1, got {n_divisor!r}")
    block = _block_shape(block_shape)
    url = cache_url(cache)
    assert url is not None  # only cache=False has none
    path = Path(url.removeprefix("journal:")) if url.startswith("journal:") else sqlite_file(with_driver(url))
    if path is not None and not path.exists():
        raise CommandError(f"--cache: no autotune cache at {path} ({FILLED_BY})")
    try:
        storage = open_existing(url)
    except StorageError as exc:
        raise CommandError(f"--cache: {exc}") from None
    rows = entries(storage, kernel)
    if not rows:
        raise CommandError(f"--cache: {shown(url)} holds no tuned kernel" + (f" named {kernel}" if kernel else "")
                           + f" ({FILLED_BY})")
    try:
        if fmt == "json":
            print(write_json(rows, Path(out or EXPORT_JSON)))
        elif fmt == "vllm-block-fp8":
            for written in write_vllm_block_fp8(rows, Path(out or EXPORT_VLLM_DIR), batch, n, k, block):
                print(written)
        else:
            for written in write_vllm_moe(rows, Path(out or EXPORT_VLLM_DIR), batch, experts, n, divisor, block):
                print(written)
    except ExportError as exc:
        raise CommandError(str(exc)) from None
    return 0
