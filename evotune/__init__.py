"""evotune: an evolutionary autotuner for GPU kernels."""

__version__ = "0.1.0"
