"""What ``tune-model`` uses of ``evotune.autotune``, imported here only: its ahead-of-time entry point and what
it reports per key, its module loader, the six fields of a vLLM Triton configuration and the check of a vLLM
config file."""

from __future__ import annotations

from evotune.triton_tuning.ahead import AheadError, KeyProgress, load_module, tune_kernel
from evotune.triton_tuning.export import VLLM_FIELDS, check_vllm_config
from evotune.triton_tuning.export import ExportError as VllmFileError

__all__ = ["VLLM_FIELDS", "AheadError", "KeyProgress", "VllmFileError", "check_vllm_config", "load_module",
           "tune_kernel"]
