"""evotune: an evolutionary autotuner for GPU kernels."""

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

from evotune.core.problem import Problem  # what lookup() and compile_best() are asked about
from evotune.reporting.lookup import compile_best, lookup  # the runtime API

if TYPE_CHECKING:
    from evotune.autotune import autotune


def __getattr__(name: str) -> Any:
    """``evotune.autotune``, imported on first use: it brings the strategies and the study storage, which
    ``import evotune`` alone does not load."""
    if name == "autotune":
        from evotune.autotune import autotune

        globals()["autotune"] = autotune  # importing the subpackage bound its module to this name
        return autotune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Problem", "__version__", "autotune", "compile_best", "lookup"]
