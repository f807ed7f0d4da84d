"""evotune: an evolutionary autotuner for GPU kernels."""

__version__ = "0.1.0"

from evotune.lookup import compile_best, lookup  # the runtime API


def __getattr__(name: str) -> object:
    """``evotune.autotune``, imported on first use: it needs triton, which the rest of evotune does not."""
    if name == "autotune":
        from evotune.autotune import autotune

        globals()["autotune"] = autotune  # importing the subpackage bound its module to this name
        return autotune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", "autotune", "compile_best", "lookup"]
