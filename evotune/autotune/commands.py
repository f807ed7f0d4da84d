"""The bodies of ``python -m evotune tune-kernel`` and ``export-configs``; ``cli.py`` shows a
:class:`CommandError` as its one line, exit code 2."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from evotune.autotune.ahead import AheadError, tune_kernel
from evotune.autotune.cache import cache_url
from evotune.autotune.export import ExportError, entries, write_json, write_vllm_moe
from evotune.storage.study import open_existing
from evotune.storage.url import StorageError


class CommandError(ValueError):
    """A bad argument or input file, in one line naming it and the field."""


def tune_kernel_command(kernel: str, keys: str | None, cache: str | None, console: Console,
                        space: str | None = None, key_names: str | None = None) -> int:
    if not keys:
        raise CommandError("--keys KEYS.toml is required (the keys to tune)")
    try:
        results = tune_kernel(kernel, Path(keys), cache, space, key_names)
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


def export_command(cache: str | None, kernel: str | None, fmt: str, out: str | None, batch: str, experts: str,
                   n: str, n_divisor: str = "1") -> int:
    try:
        divisor = int(n_divisor)
    except ValueError:
        divisor = 0
    if divisor < 1:
        raise CommandError(f"--n-divisor: expected an integer >= 1, got {n_divisor!r}")
    url = cache_url(cache)
    assert url is not None  # only cache=False has none
    try:
        storage = open_existing(url)
    except StorageError as exc:
        raise CommandError(f"--cache: {exc}") from None
    rows = entries(storage, kernel)
    if not rows:
        raise CommandError(f"--cache: {url} holds no tuned kernel" + (f" named {kernel}" if kernel else ""))
    try:
        if fmt == "json":
            print(write_json(rows, Path(out or "autotune_configs.json")))
        else:
            for path in write_vllm_moe(rows, Path(out or "."), batch, experts, n, divisor):
                print(path)
    except ExportError as exc:
        raise CommandError(str(exc)) from None
    return 0
