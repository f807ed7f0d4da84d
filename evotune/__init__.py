"""evotune: an evolutionary autotuner for GPU kernels."""

__version__ = "0.1.0"

from evotune.reporting.lookup import compile_best, lookup  # the runtime API

__all__ = ["__version__", "compile_best", "lookup"]
