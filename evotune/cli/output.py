"""What the command line prints and how it fails: consoles wide enough for tables, and the one-line error.

Bad input (an experiment file, a path, a name) ends with one line on stderr that names the file and the field,
and exit code 2 (:data:`EXIT_USAGE`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:  # the report's rows; reporting is imported where a command reports
    from evotune.reporting.report import Best

EXIT_USAGE = 2


def make_console(stderr: bool = False) -> Console:
    # Rich falls back to 80 columns when output is not a terminal (CI logs, pipes): too narrow for tables. A width
    # the environment states ($COLUMNS, which Rich reads) is taken as it is.
    out = sys.stderr if stderr else sys.stdout
    stated = os.environ.get("COLUMNS", "").isdigit()
    return Console(stderr=stderr, width=None if out.isatty() or stated else 130)


class UsageError(Exception):
    """A mistake the user can fix; shown as one line, exit code 2."""


def add_to_tuned_cache(rows: list[Best], storage: str, console: Console) -> None:
    """The results go into the tuning-result cache that evotune.lookup() reads, each with its oracle (gpu, cpu,
    replay), which lookup() selects by."""
    from evotune.core.tuned_cache import remember as merge

    if rows:
        cache = merge(rows, storage)
        if cache.set_aside is not None:
            console.print(f"[yellow]warning:[/] {cache.set_aside}")
        console.print(f"tuning-result cache: {cache.path}")
