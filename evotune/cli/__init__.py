"""The command line: ``python -m evotune COMMAND`` (see :mod:`evotune.cli.main`)."""

from evotune.cli.main import main

__all__ = ["main"]
