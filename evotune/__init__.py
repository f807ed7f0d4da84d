"""evotune: an evolutionary autotuner for GPU kernels."""

__version__ = "0.1.0"

from evotune.core.problem import Problem  # what lookup() and compile_best() are asked about
from evotune.reporting.lookup import compile_best, lookup  # the runtime API
from evotune.triton_tuning.decorator import autotune  # the tuned kernel's modules load when a kernel is decorated

__all__ = ["Problem", "__version__", "autotune", "compile_best", "lookup"]
