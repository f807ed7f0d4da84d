"""What ``tune-model`` uses of ``evotune.autotune``, imported here only: its ahead-of-time entry point and what
it reports per key, its module loader, and the six fields of a vLLM Triton configuration."""

from __future__ import annotations

from evotune.autotune.ahead import AheadError, KeyProgress, load_module, tune_kernel
from evotune.autotune.export import VLLM_FIELDS

__all__ = ["VLLM_FIELDS", "AheadError", "KeyProgress", "load_module", "tune_kernel"]
